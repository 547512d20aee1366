"""Small KFP pipelines for the tests, compiled by tests/support/kfp_server.py.

No ``from __future__ import annotations`` here: kfp reads the component annotations as types.
The components are KFP lightweight components: kfp embeds their source in the compiled YAML and
``kfp.local`` runs them with the server's interpreter.
"""

BASE_IMAGE = "python:3.11"
FAILURE_MESSAGE = "bad data in shard 7"


def define_pipelines() -> dict:
    """Define the test pipelines (imports kfp lazily so that collecting tests stays cheap)."""
    from kfp import dsl, kubernetes

    @dsl.component(base_image=BASE_IMAGE)
    def add(a: int, b: int) -> int:
        print(f"adding {a} + {b}")
        return a + b

    @dsl.pipeline(name="tiny")
    def tiny(a: int = 1, b: int = 2) -> int:
        first = add(a=a, b=b)
        return add(a=first.output, b=10).output

    @dsl.component(base_image=BASE_IMAGE)
    def fail_with(message: str):
        raise ValueError(message)

    @dsl.pipeline(name="failing")
    def failing(message: str = FAILURE_MESSAGE):
        fail_with(message=message)

    @dsl.component(base_image=BASE_IMAGE)
    def sleep_for(seconds: float) -> str:
        import os
        import time

        print(f"sleeper pid {os.getpid()} pgid {os.getpgrp()}", flush=True)
        time.sleep(seconds)
        return "slept"

    @dsl.pipeline(name="slow")
    def slow(seconds: float = 60.0) -> str:
        return sleep_for(seconds=seconds).output

    @dsl.component(base_image=BASE_IMAGE)
    def sleep_beside_a_session_of_its_own(seconds: float) -> str:
        """Starts a child in a session of its own (as torchrun does its agent and workers), then sleeps."""
        import os
        import subprocess
        import sys
        import time

        child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True)
        print(f"session child pid {child.pid} sid {os.getsid(child.pid)}; step pgid {os.getpgrp()}", flush=True)
        time.sleep(seconds)
        child.wait()
        return "slept"

    @dsl.pipeline(name="detached")
    def detached(seconds: float = 60.0) -> str:
        return sleep_beside_a_session_of_its_own(seconds=seconds).output

    @dsl.component(base_image=BASE_IMAGE)
    def stop_slowly(seconds: float, stop_s: float) -> str:
        """Sleeps; on SIGTERM takes ``stop_s`` seconds to stop (a trainer's blocking save)."""
        import signal
        import sys
        import time

        def on_term(signum, frame):
            print(f"SIGTERM: stopping in {stop_s} s", flush=True)
            time.sleep(stop_s)
            sys.exit(143)

        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(seconds)
        return "done"

    @dsl.pipeline(name="stubborn")
    def stubborn(seconds: float = 300.0, stop_s: float = 4.0) -> str:
        return stop_slowly(seconds=seconds, stop_s=stop_s).output

    @dsl.pipeline(name="platform")
    def platform(a: int = 1) -> int:
        task = add(a=a, b=1)
        kubernetes.use_secret_as_env(
            task, secret_name="s3-creds", secret_key_to_env={"key": "AWS_ACCESS_KEY_ID"}
        )
        kubernetes.add_node_selector(task, label_key="nvidia.com/gpu.present", label_value="true")
        return task.output

    @dsl.component(base_image=BASE_IMAGE)
    def fake_train(
        dataset_source: str,
        model_name: str,
        epochs: int,
        global_batch_size: int,
        adaptive_batch: bool,
        max_global_batch_size: int,
        learning_rate: float,
        min_workers: int,
        max_workers: int,
        checkpoint_interval_steps: int,
        checkpoint_interval_s: float,
        fault_at_step: int,
        job_key: str,
        backend: str,
        step_s: float,
    ) -> str:
        import json
        import os
        import time

        print(f"train {model_name} on {dataset_source} job_key={job_key} pid={os.getpid()}", flush=True)
        # per-step records where the real train step writes them (TRAINFLOW_LOG_DIR, set by the server)
        log_dir = os.environ.get("TRAINFLOW_LOG_DIR")
        metrics = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            metrics = open(os.path.join(log_dir, "train-metrics.jsonl"), "a")  # noqa: SIM115
            metrics.write(json.dumps({"event": "start", "world_size": 1, "total_steps": epochs}) + "\n")
        for epoch in range(epochs):
            time.sleep(step_s)
            print(f"epoch {epoch + 1}/{epochs} done", flush=True)
            if metrics:
                rec = {"step": epoch + 1, "epoch": epoch, "loss": 1.0 / (epoch + 1), "samples_per_s": 100.0,
                       "world_size": 1, "time": time.time()}
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
        return job_key

    @dsl.pipeline(name="training-pipeline")
    def training_pipeline(
        dataset_source: str = "mnist",
        model_name: str = "small_cnn",
        epochs: int = 2,
        global_batch_size: int = 64,
        adaptive_batch: bool = False,
        max_global_batch_size: int = 0,
        learning_rate: float = 0.01,
        min_workers: int = 1,
        max_workers: int = 2,
        checkpoint_interval_steps: int = 50,
        checkpoint_interval_s: float = 60.0,
        fault_at_step: int = 0,
        job_key: str = "",
        backend: str = "local",
        step_s: float = 0.5,
    ) -> str:
        return fake_train(
            dataset_source=dataset_source,
            model_name=model_name,
            epochs=epochs,
            global_batch_size=global_batch_size,
            adaptive_batch=adaptive_batch,
            max_global_batch_size=max_global_batch_size,
            learning_rate=learning_rate,
            min_workers=min_workers,
            max_workers=max_workers,
            checkpoint_interval_steps=checkpoint_interval_steps,
            checkpoint_interval_s=checkpoint_interval_s,
            fault_at_step=fault_at_step,
            job_key=job_key,
            backend=backend,
            step_s=step_s,
        ).output

    return {
        "tiny": tiny,
        "failing": failing,
        "slow": slow,
        "stubborn": stubborn,
        "detached": detached,
        "platform": platform,
        "training_pipeline": training_pipeline,
    }


def define_contract_pipelines(image: str) -> dict:
    """The API-contract tests' pipelines (tests/integration/test_kfp_api_contract.py), one step each
    so that a run is quick on the real KFP backend too (a driver and a launcher pod per step there).

    ``image`` is the step's container image: on the real backend one the node already holds (the
    trainflow image, whose venv has kfp, hence ``install_kfp_package=False``); the local server
    runs the step with its own interpreter and ignores it.
    """
    from kfp import dsl

    @dsl.component(base_image=image, install_kfp_package=False)
    def add(a: int, b: int) -> int:
        print(f"adding {a} + {b}")
        return a + b

    @dsl.pipeline(name="contract-add")
    def contract_add(a: int = 1, b: int = 2) -> int:
        return add(a=a, b=b).output

    @dsl.component(base_image=image, install_kfp_package=False)
    def sleep_for(seconds: float) -> str:
        import time

        print("sleeping", flush=True)
        time.sleep(seconds)
        return "slept"

    @dsl.pipeline(name="contract-sleep")
    def contract_sleep(seconds: float = 600.0) -> str:
        return sleep_for(seconds=seconds).output

    return {"add": contract_add, "sleep": contract_sleep}
