from airflow_heartbeat_fix.cli import main

raise SystemExit(main())
