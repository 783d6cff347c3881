import sys

from titan_train.cli.train import main

sys.exit(main())
