import sys

from timm_recursive.cli import main

sys.exit(main())
