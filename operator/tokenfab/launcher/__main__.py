"""`python3 -m tokenfab.launcher`: the worker pod's command (see tokenfab.launcher)."""

from tokenfab.launcher.run import main

raise SystemExit(main())
