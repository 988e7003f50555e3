#!/usr/bin/env python3
"""``timm-recursive-train-dino`` as a script: see ``timm_recursive/cli/train_dino.py``."""
import sys

from timm_recursive.cli.train_dino import main

if __name__ == '__main__':
    sys.exit(main())
