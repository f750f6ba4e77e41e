"""Progress messages of a job: to stderr, which each rule script sends to the job's log."""

import sys


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
