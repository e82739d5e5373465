from kgtrace.cli import main

raise SystemExit(main())
