"""Entry point of every training worker: ``torchrun [...] -m components.training [flags]``.

Also runs as a lone process (``python -m components.training ...``) for debugging. Flags are listed
by ``--help``; ``--config FILE`` / ``--config-json`` give the whole config as JSON (flags override).

Exit codes: 0 done; 2 bad input (config, dataset, checkpoint storage — permanent, not worth a
retry); 143 preempted by SIGTERM after saving a checkpoint (retryable); 1 any other failure (e.g. a
peer died), after which torchrun restarts the worker group.

On a failure the worker waits for an in-flight checkpoint persist, prints the traceback and leaves
with ``os._exit``: tearing down a torch interpreter takes 1-2 s, which would only delay the restart.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from components.training import config as config_mod
from components.training.checkpoint.storage import CheckpointStorageError
from components.training.data import DatasetError
from components.training.distributed import DistEnv, destroy_process_group, init_process_group

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
PERSIST_GRACE_S = 20.0


def _setup_logging(env: DistEnv) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank {env.rank}/{env.world_size}] %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    config_mod.add_arguments(parser)
    args = parser.parse_args(argv)
    env = DistEnv.from_env()
    _setup_logging(env)
    try:
        cfg = config_mod.from_args(args)
    except config_mod.ConfigError as e:
        print(f"trainflow: invalid training config: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    from components.training.trainer import EXIT_PREEMPTED, Preempted, Trainer

    init_process_group(env)
    try:
        try:
            trainer = Trainer(cfg, env)
        except (DatasetError, CheckpointStorageError, ValueError) as e:
            print(f"trainflow: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            trainer.train()
        except Preempted as e:
            logging.getLogger("trainflow.trainer").warning("%s", e)
            return EXIT_PREEMPTED
        except config_mod.ConfigError as e:  # found on load, e.g. a checkpoint of the other batch mode
            print(f"trainflow: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception:
            traceback.print_exc()
            trainer.ckpt.wait(timeout_s=PERSIST_GRACE_S)  # a checkpoint being written is still worth having
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_FAILED)
        return 0
    finally:
        destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
