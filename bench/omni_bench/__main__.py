import sys

from bench.omni_bench.cli import main

sys.exit(main())
