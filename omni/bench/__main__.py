import sys

from omni.bench.cli import main

sys.exit(main())
