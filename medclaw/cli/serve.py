"""`medclaw serve`: the jobs API and the audit viewer, on loopback, behind a bearer token.

    medclaw serve [--host 127.0.0.1] [--port 8080] [--config F] [--profile P] [--allow-root DIR]
                  [--data-dir D] [--concurrency N] [--max-upload-mb MB] [--kb INDEX] [--skills DIR]

Everything is checked before an engine starts: the config (its `server:` section, see
`medclaw.server.settings`), the models of every profile served, the KB, the data folder, the
token file and the port (bound first, so a port in use is a one-line error, not a failure after
the engines started). Then the engines start — progress on stderr — and only then is the first
request served. The bearer token is created on first start in `<data dir>/token` (mode 0600);
the page at http://HOST:PORT/ asks for it (or takes it from `#token=…` in its address).
Ctrl-C or SIGTERM stops the service (exit 0): running jobs are queued again for the next start. Exit 3:
the engines failed to start (uvicorn prints why).
"""
from __future__ import annotations

import argparse
import sys


def register(parser: argparse.ArgumentParser) -> None:
    from medclaw.cli.ask import add_runtime_arguments

    parser.add_argument("--host", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, metavar="PORT", help="port (default 8080; 0 picks a free one)")
    add_runtime_arguments(parser)
    parser.add_argument("--allow-root", action="append", metavar="DIR",
                        help="a folder whose videos jobs may name by path (repeatable; adds to "
                             "the config's server.allowed_roots)")
    parser.add_argument("--data-dir", metavar="D",
                        help="jobs database, token, uploads and traces (default $MEDCLAW_HOME/server)")
    parser.add_argument("--concurrency", type=int, metavar="N", help="episodes in flight at once (default 2)")
    parser.add_argument("--max-upload-mb", type=float, metavar="MB", help="largest upload accepted (default 2048)")
    parser.set_defaults(handler=_handle)


def _handle(args) -> int:
    import os
    import socket
    from pathlib import Path

    from medclaw.config_file import profile_name, read_config_file
    from medclaw.engine.config import load_episode_config
    from medclaw.engine.runtime import open_runtime
    from medclaw.errors import ConfigError
    from medclaw.models.registry import parse_overrides
    from medclaw.server.settings import load_server_settings

    config = read_config_file(args.config)
    settings = load_server_settings(config, add_roots=args.allow_root, host=args.host,
                                    port=args.port, data_dir=args.data_dir,
                                    concurrency=args.concurrency, max_upload_mb=args.max_upload_mb)
    if args.profile:
        profiles = [args.profile]
    else:
        profiles = settings.profiles or [profile_name(None, config)]
    overrides = parse_overrides(args.model)
    episode_configs = {p: load_episode_config(args.config, profile=p) for p in profiles}
    runtimes = {p: open_runtime(profile=p, config_path=args.config, overrides=overrides,
                                kb_dir=args.kb, skills_dir=args.skills,
                                decode_device=args.decode_device) for p in profiles}

    data_dir = settings.resolved_data_dir()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(data_dir, 0o700)                  # jobs, traces and uploads are patient data
    except OSError as err:
        raise ConfigError(f"cannot use data folder {data_dir}: {err.strerror or err}") from None
    from medclaw.server.security import load_or_create_token

    token_file = Path(data_dir) / "token"
    load_or_create_token(token_file)
    try:
        sock = socket.create_server((settings.host, settings.port))
    except OSError as err:
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: "
                          f"{err.strerror or err}") from None
    return _serve(sock, settings, profiles, runtimes, episode_configs, data_dir, token_file)


def _serve(sock, settings, profiles, runtimes, episode_configs, data_dir, token_file) -> int:
    import signal

    import uvicorn

    from medclaw.server.app import create_app
    from medclaw.server.jobs import JobManager
    from medclaw.server.security import load_or_create_token
    from medclaw.server.store import JobStore

    store = JobStore(data_dir / "jobs.sqlite")
    manager = JobManager(store, runtimes, episode_configs, data_dir=data_dir,
                         concurrency=settings.concurrency)
    app = create_app(manager, settings, load_or_create_token(token_file))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"medclaw serve: http://{shown}:{port}/  (profiles: {', '.join(profiles)}; "
          f"token in {token_file}; data in {data_dir})", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="on", timeout_graceful_shutdown=10))
    # SIGTERM (a service manager's stop) ends like Ctrl-C: uvicorn shuts down cleanly, restores this
    # handler and raises the signal again, which lands in the `except` below.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it handled, after a clean shutdown (engines closed,
        # running jobs queued again): that is the normal way to stop the service.
        print("medclaw serve: stopped; unfinished jobs run again at the next start",
              file=sys.stderr, flush=True)
    finally:
        sock.close()
        store.close()
    return 0 if server.started else 3


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":                             # vLLM spawns processes: keep a main guard
    from medclaw.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
