from epp.cli import main

raise SystemExit(main())
