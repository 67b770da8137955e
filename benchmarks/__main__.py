import sys

from .speed import main

sys.exit(main())
