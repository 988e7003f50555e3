#!/usr/bin/env python3
"""``timm-recursive-push-to-hub`` as a script: see ``timm_recursive/cli/push_to_hub.py``."""
import sys

from timm_recursive.cli.push_to_hub import main

if __name__ == '__main__':
    sys.exit(main())
