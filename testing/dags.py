"""Store a Dag the way the Dag processor does, on every Airflow 3 release."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def ensure_bundle(name: str, session: Session) -> None:
    """The Dag bundle row a stored Dag points at, committed if it was missing."""
    from airflow.models.dagbundle import DagBundleModel

    if session.get(DagBundleModel, name) is None:
        session.add(DagBundleModel(name=name))
        session.commit()


def _sync_bag_to_db() -> Any:
    """Airflow's "store this bag" function: moved between releases, a method of the bag on 3.0."""
    try:  # 3.2+
        from airflow.dag_processing.dagbag import sync_bag_to_db
    except ImportError:
        try:  # 3.1
            from airflow.models.dagbag import sync_bag_to_db  # type: ignore[no-redef]
        except ImportError:  # 3.0

            def sync_bag_to_db(dagbag: Any, *args: Any, **kwargs: Any) -> None:
                dagbag.sync_to_db(*args, **kwargs)

    return sync_bag_to_db


def _dag_bag() -> Any:
    try:  # 3.2+
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # 3.0/3.1
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]
    return DagBag(collect_dags=False)


def sync_dag_to_db(dag: Any, bundle_name: str, bundle_version: str | None, session: Session) -> None:
    """Bag ``dag`` and sync the bag (Dag, version, serialized Dag) in ``session``, flushed, not committed."""
    bag = _dag_bag()
    bag.bag_dag(dag)
    _sync_bag_to_db()(bag, bundle_name, bundle_version, session=session)
    session.flush()
