"""Command line: ``fedmpi run | sweep | table | info | plot | export | pi | ...`` (docs/INTERFACES.md).

Exit codes: 0 done; 2 bad input, with ONE line on stderr naming the key or file; 3
interrupted (checkpointed); 4 diverged (a loss or the model became NaN/inf); 1 anything else.

Start-up stays fast: this module imports nothing heavy, and only the module of the command
being run is imported (``fedmpi --help`` and ``fedmpi info`` never load torch).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from . import __version__, log, signals
from .errors import Diverged, InputError, Interrupted, WriteFailed, exit_code
from .runtime.launcher import launched_rank, launched_size, record_exit


class _Parser(argparse.ArgumentParser):
    """argparse that raises InputError (exit 2, one line) instead of printing usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        where = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        raise InputError(f"{where}: {message}" if where else message)


# Subcommands implemented next to their subject: (name, module, help); each module has
# add_arguments(parser) and run_cli(args) -> exit code. Only the module of the command given
# is imported.
_EXTENSIONS = [
    ("sweep", ".sweep", "run a grid of configs (locally, -j N at once, or as a SLURM array)"),
    ("table", ".results.table", "mean +/- std over seeds of a metric, as Markdown, CSV or LaTeX"),
    ("export", ".results.export", "metric rows of result files as CSV"),
    ("export-peft", ".models.peft_export", "the final LoRA adapter of a run in PEFT's format (adapter_config.json "
                                           "+ adapter_model.safetensors)"),
    ("plot", ".results.plot", "metrics of runs, folders or sweeps as a figure (.png, .pdf, .svg)"),
    ("pi", ".participation.pi", "stationary participation distribution pi_R of the Markov sampler"),
    ("availability", ".participation.show", "print or plot the p_i^t trajectories of a config"),
    ("markov-plot", ".results.markov_plots", "Figure 1 study (pi_R vs R) and per-client participation shares"),
    ("dp-factor", ".privacy.dpfactor", "error and sensitivity of banded_mf's factor for N rounds, B bands"),
]


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; the arguments of an extension command are added only when ``argv`` names it
    (every command's when ``argv`` is None)."""
    wanted = _command_in(argv) if argv is not None else "*"
    p = _Parser(prog="fedmpi", description="Emulate federated-learning clusters with MPI ranks.")
    p.add_argument("--version", action="version", version=f"fedmpi {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run an experiment from a YAML config")
    r.add_argument("config", help="YAML config file")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted path), e.g. --set train.lr=0.1; repeatable")
    r.add_argument("--out",
                   help="result file (default: the config's output, or runs/{name}-{algorithm.name}-s{seed}.h5)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace an existing result file (a completed run, or a file that is not a result file)")
    r.add_argument("--plot", help="also write a PNG of test accuracy (test loss for regression) here")
    r.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint (required to exist; a run also resumes by itself "
                        "when a checkpoint of the same config is present)")
    r.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    _add_plugin_option(r)

    i = sub.add_parser("info", help="status, rounds and last metrics of result files (several: compared)")
    i.add_argument("files", nargs="+")
    i.add_argument("--no-config", action="store_true", help="do not print the stored config")
    i.add_argument("--verbose", "-v", action="store_true",
                   help="several files: after the verdict, every metric's last value and the config keys they "
                        "share (default: only what differs)")
    _add_plugin_option(i)

    for name, module, text in _EXTENSIONS:
        sp = sub.add_parser(name, help=text)
        if wanted not in ("*", name):
            continue  # not this command: its module stays unimported
        try:
            mod = importlib.import_module(module, __package__)
        except ImportError:  # an optional part that is not in this build
            continue
        mod.add_arguments(sp)
        _add_plugin_option(sp)
        sp.set_defaults(_handler=mod.run_cli)
    return p


def _add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """``--plugin``: every command that reads configs or results takes it (fedmpi.plugins)."""
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH_OR_MODULE",
                        help="import a plug-in (a .py file, a package folder or a module name) that registers "
                             "algorithms, models, datasets or availability kinds; repeatable (also $FEDMPI_PLUGINS)")


def _load_plugins(args: argparse.Namespace) -> None:
    """The plug-ins of a command that does not load them itself (run and sweep choose when), when
    any are asked for: without them a command that only reads results never imports torch."""
    if args.command in ("run", "sweep"):
        return
    from . import plugins

    if args.plugins or os.environ.get(plugins.ENV):
        plugins.load(args.plugins)


def _cmd_run(args: argparse.Namespace) -> int:
    from . import config, plugins
    from .execute import execute, input_files
    from .results.paths import output_path
    from .runtime import launched_size
    from .runtime.launcher import agree_before_the_world

    if args.out is not None and not args.out.strip():
        raise InputError("--out: empty result path")
    if args.overwrite and args.resume:
        raise InputError("--overwrite: cannot be combined with --resume (one starts afresh, the other continues)")
    if args.plot:  # before the run, not after it
        from .results.outfiles import check_figure

        check_figure(args.plot, "--plot", [args.config])
    error = None
    try:  # on every rank: the plug-ins before the config is checked against the registries
        with signals.interruptible("before the run started; nothing was run"):
            plugins.load(args.plugins)
            cfg = config.load(args.config, args.overrides, world_size=launched_size())
    except (InputError, Interrupted) as e:
        error = e
    agree_before_the_world(error)  # a rank's own error (a plug-in missing on its node) stops all
    if args.out is not None:  # --out may use {dotted.key} placeholders, as the output key does
        from .results.paths import fill_placeholders

        out = fill_placeholders(args.out, cfg.to_dict(), "--out")
    else:
        out = output_path(cfg)
    cfg.output = out  # the result file records the path it is written to (--out's, placeholders filled)
    code = execute(cfg, out, quiet=args.quiet, resume=args.resume, overwrite=args.overwrite,
                   inputs=input_files(cfg, args.config))
    if code == 0 and launched_rank() == 0:
        if args.plot:
            from .results.hdf5 import read_metrics
            from .results.plot import plot

            metric = "test_acc" if "test_acc" in read_metrics(out)[0] else "test_loss"
            plot([out], metric, args.plot)
        if not args.quiet:
            print(f"fedmpi: wrote {out}" + (f" and {args.plot}" if args.plot else ""), file=sys.stderr)
    return code


def _cmd_info(args: argparse.Namespace) -> int:
    from .results.info import compare, describe

    if len(args.files) == 1:
        print(describe(args.files[0], show_config=not args.no_config))
    else:
        print(compare(args.files, show_config=not args.no_config, verbose=args.verbose))
    return 0


def _quiet_broken_pipe() -> int:
    """The reader of our stdout went away (``fedmpi info X | head``): stop without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError, AttributeError):
        pass
    return 0


def _stops(argv: list[str]) -> bool:
    """Whether the command is one that a stop signal must end with exit 3 (never a kill)."""
    return _command_in(argv) in ("run", "sweep")


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. Called in-process (tests, notebooks), ``run`` and
    ``sweep`` trap the stop signals for the call only, starting with none remembered; the
    process entry point (``entry``) traps them for good, before anything slow."""
    log.setup(launched_rank())
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with signals.trapped() if _stops(argv) else contextlib.nullcontext():
            args = build_parser(argv).parse_args(argv)
            _load_plugins(args)
            handler = getattr(args, "_handler", None) or {"run": _cmd_run, "info": _cmd_info}[args.command]
            code = int(handler(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (InputError, Interrupted, Diverged, WriteFailed, KeyboardInterrupt) as e:
        return exit_code(e, launched_rank())


def entry() -> None:
    """The console command: ``main`` with the stop signals trapped from the start to the exit of a
    run or sweep (before torch is imported; Python would otherwise restore the killing default
    handlers when ``main`` returns), and rank 0's exit code recorded for launch/fedmpi-launch.

    Under launch/fedmpi-launch (``FEDMPI_EXIT_FILE`` set) every rank of a multi-rank run exits 0
    after an ending all ranks agreed on (2 bad input, 3 interrupted, 4 diverged), and the launcher
    returns rank 0's recorded code: a rank's non-zero exit makes Open MPI print its failure banner
    ("prterun detected that one or more processes exited with non-zero status") and srun one
    error line per rank, for what is no failure of the job."""
    code = 1
    if _stops(sys.argv[1:]):  # a stop signal from now on: exit 3, never a kill
        signals.install()
    try:
        code = main()
    finally:
        recorded = record_exit(code)
        signals.ignore_from_now()  # the code is settled; teardown must not turn it into a kill
    agreed = code in (2, 3, 4) and launched_size() > 1 and os.environ.get("FEDMPI_EXIT_FILE")
    sys.exit(0 if agreed and (recorded or launched_rank() != 0) else code)
