import sys

from titan_train.cli import main

sys.exit(main())
