#!/usr/bin/env python3
"""``timm-recursive-evaluate`` as a script: see ``timm_recursive/cli/evaluate.py``."""
import sys

from timm_recursive.cli.evaluate import main

if __name__ == '__main__':
    sys.exit(main())
