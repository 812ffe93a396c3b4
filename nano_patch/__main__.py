import sys

from nano_patch.cli import main

sys.exit(main())
