"""The `controlcenter` command: serve, worker, and manage-style passthrough."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

from controlcenter.env import ImproperEnvironment, env_int
from controlcenter.localmodel import LocalModelSupervisor, config_from_env, supervise_if_wanted


def _deferral(value: str) -> str:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"--tool-deferral must be 'on' or 'off', not {value!r}")
    return value


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type for a whole number in a range (the benches' options use it too)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {number}")
        if maximum is not None and number > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, not {number}")
        return number

    return parse


# Celery would take 0 for "one thread per CPU", and a negative count fails deep in its pool.
_at_least_one = whole_number(1)
# uvicorn takes a port past 65535 modulo 65536 (it listened on another port than it logged) and a
# negative one only after the whole app has started.
_port = whole_number(1, 65535)


WEB_KEEP_ALIVE_SECONDS = 65
WEB_SHUTDOWN_GRACE_SECONDS = 5


def _apply_common(args: argparse.Namespace) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")
    if args.tool_deferral is not None:
        # Settings read the variable, so the flag reaches every module the same way.
        os.environ["CC_SERVER_TOOL_DEFERRAL"] = args.tool_deferral


def _serve(args: argparse.Namespace) -> int:
    # Only `serve` needs uvicorn; `worker`, `manage` and `--help` skip its import.
    import uvicorn

    workers = args.workers or env_int("CC_WEB_WORKERS", 1, minimum=1)
    if workers > 1 and not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        # Embedded mode keeps its worker thread and in-memory channel layer inside the one process.
        raise ImproperEnvironment("CC_WEB_WORKERS above 1 needs services mode (DATABASE_URL and REDIS_URL).")
    # A bounded database pool per web process (see CC_DB_POOL_MAX in settings): 20 for one or two
    # processes, then 40 shared out, so several processes stay well inside PostgreSQL's 100 clients.
    os.environ.setdefault("CC_DB_POOL_MAX", str(min(20, max(5, 40 // workers))))
    # A bad environment stops here with its one-line message, before uvicorn imports the app.
    from django.conf import settings

    settings.INSTALLED_APPS  # noqa: B018

    uvicorn.run(
        "controlcenter.asgi:application",
        host=args.host,
        port=args.port,
        log_level="info",
        # Web processes are stateless in services mode (runs live in PostgreSQL, events go through
        # Redis), so several can share the port; one CPU-bound process tops out near 30 requests/s.
        workers=workers,
        lifespan="on",
        # A SIGTERM waits this long for open requests and websockets, then cancels what is left.
        # Found unbounded: a consumer whose channel-layer receive had lost its cancellation (Python
        # 3.11's wait_for in redis-py's writes; fixed in controlcenter/channel_redis.py) kept `serve`
        # waiting until it was killed, 15 s in the tests and past compose's 10 s grace. The bound
        # stays for whatever else may hang a consumer; clients reconnect and catch up (OP-1).
        timeout_graceful_shutdown=WEB_SHUTDOWN_GRACE_SECONDS,
        # uvicorn closes an idle keep-alive connection after 5 s by default; a client or proxy that
        # sends its next request on it at that moment gets "server disconnected" (httpx does not
        # retry, nginx answers 502). Longer than the 60 s proxies keep idle upstream connections.
        timeout_keep_alive=WEB_KEEP_ALIVE_SECONDS,
    )
    return 0


def _worker(args: argparse.Namespace) -> int:
    # After _apply_common: the Celery app reads Django's settings when it is imported.
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker as celery_worker
    from django.conf import settings

    from controlcenter.celery import app

    # Django's system checks import every URL's view (DRF, drf-spectacular, django.test), a third of
    # a worker's start, and Celery ignores what they find; `manage bootstrap` runs them before
    # `serve` (`make run`, compose).
    os.environ.setdefault("CELERY_SKIP_CHECKS", "1")
    # Consume the queue runs are sent to (CC_RUN_QUEUE), or a worker would idle beside them. No
    # gossip or mingle: workers share nothing but the database and the queue, and mingling at
    # start waits for answers from every other worker.
    argv = [
        "--loglevel=INFO", f"--concurrency={args.concurrency}", f"--queues={settings.CC_RUN_QUEUE}",
        "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    if args.hostname:
        argv.append(f"--hostname={args.hostname}")
    # Celery's own `worker` command, without the `celery` umbrella: that one imports every other
    # subcommand first, the `amqp` shell's prompt_toolkit among them (a quarter of a worker's start).
    celery_worker.main(argv, prog_name="controlcenter worker", obj=CLIContext(app=app, no_color=None, workdir=None))
    return 0


def _local_model(args: argparse.Namespace) -> int:
    """The local model server alone, in the foreground, for workers on other hosts (LM-1)."""
    if args.port is not None:
        os.environ["CC_LOCAL_MODEL_PORT"] = str(args.port)
    supervisor = LocalModelSupervisor(config_from_env(host=args.host)).start()
    print(f"Local model: serving {supervisor.config.model_path.name} on {supervisor.config.base_url}", flush=True)  # noqa: T201
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopped:
            signal.pause()
    finally:
        supervisor.stop()
    return 0


def _with_local_model(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    supervisor = supervise_if_wanted(args.command)
    try:
        return command(args)
    finally:
        if supervisor is not None:
            supervisor.stop()


def _manage(argv: list[str]) -> int:
    # After _apply_common set DJANGO_SETTINGS_MODULE and the flags' variables.
    from django.core.management import execute_from_command_line

    # Django names the program in its usages and in "Type '<prog> help <subcommand>'".
    execute_from_command_line(["controlcenter manage", *argv])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="controlcenter", description="Run Control Center.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the web server (HTTP and websockets)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument(
        "--workers", type=_at_least_one, default=None, help="web processes (default CC_WEB_WORKERS or 1)"
    )
    worker = commands.add_parser("worker", help="start a Celery worker that runs agent turns")
    worker.add_argument("--concurrency", type=_at_least_one, default=2, help="runs at once (threads)")
    worker.add_argument("--hostname", default="")
    for sub in (serve, worker):
        sub.add_argument("--tool-deferral", type=_deferral, default=None, metavar="on|off")
    local = commands.add_parser("local-model", help="run the local model server (llama.cpp) on its own")
    local.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0 for workers on other hosts)")
    local.add_argument("--port", type=_port, default=None, help="default CC_LOCAL_MODEL_PORT or 8081")
    # Listed for --help only: main() hands everything after `manage` to Django, whose own options
    # given before any command (--help, -h, --version) argparse's REMAINDER would refuse.
    commands.add_parser("manage", help="run a Django management command", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["manage"]:
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")
            return _manage(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command == "local-model":
            return _local_model(args)
        _apply_common(args)
        return _with_local_model(_serve if args.command == "serve" else _worker, args)
    except ImproperEnvironment as exc:
        # The message names the variable; a traceback through Django's settings import adds nothing.
        print(f"controlcenter: {exc}", file=sys.stderr)  # noqa: T201
        return 1


if __name__ == "__main__":
    sys.exit(main())
