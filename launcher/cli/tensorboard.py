"""``tflaunch tensorboard [RUN]``: serve a run's TensorBoard data until Ctrl-C."""

from __future__ import annotations

import click

from .group import cli
from .inspect import RUN_ARG_HELP, log_dir_option


@cli.command("tensorboard", epilog=RUN_ARG_HELP)
@click.argument("run_ref", required=False, metavar="[RUN]")
@click.option("--port", type=click.IntRange(1, 65535), metavar="N",
              help="Serve on port N (default: 6006, else the next free port).")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address to listen on. TensorBoard has no authentication: keep it on loopback, and reach it "
                   "from elsewhere with 'ssh -L'.")
@log_dir_option
@click.pass_context
def tensorboard_command(ctx: click.Context, run_ref: str | None, port: int | None, host: str, log_dir: str) -> None:
    """Start TensorBoard on a run's scalars (the newest run by default), print its URL, serve until Ctrl-C."""
    from ..inspect.runs import resolve_run
    from ..run.lifecycle.signals import SIGNALS
    from ..tensorboard import TensorBoard, TensorBoardError, logdir_of, require

    require()
    run = resolve_run(log_dir, run_ref)
    logdir = logdir_of(run.path, [task.env for task in run.tasks])
    if not logdir.is_dir():
        click.echo(f"tflaunch: note: {logdir} does not exist yet; TensorBoard shows it once a task writes there",
                   err=True)
    with SIGNALS.armed_for_run():  # a signal stops the server below instead of raising
        server = TensorBoard.start(logdir, host=host, port=port)
        try:
            try:
                server.wait_ready(wait=SIGNALS.wait)
            except TensorBoardError:
                if SIGNALS.first is None:
                    raise
            if SIGNALS.first is None:
                click.echo(f"TensorBoard for run {run.run_id} at {server.url} (Ctrl-C stops it)")
            while server.process.poll() is None and SIGNALS.wait(1.0) is None:
                pass
        finally:
            server.stop()
    signum = SIGNALS.first
    ctx.exit(128 + signum if signum is not None else server.process.returncode)
