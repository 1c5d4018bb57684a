"""The local service and the audit viewer (`medclaw serve`, `medclaw trace html`).

    settings.py    ServerSettings: the `server:` section of the config file + flags
    security.py    bearer token (created 0600 on first start), allowed-roots path check
    store.py       JobStore: jobs and results in SQLite, re-queued after a restart
    jobs.py        JobManager: a bounded pool of episodes on shared engines, cancel, progress
    app.py         create_app: the FastAPI routes (jobs, trace, view, SSE steps, thumbnails, page)
    view.py        build_view: what the viewer draws, from a typed trace
    thumbnails.py  Thumbnailer: JPEGs of referenced frames, re-decoded through FrameSource
    export.py      the view of one trace as a self-contained HTML file
    static/        the viewer page (HTML/JS/CSS, no external assets)

Traces are read only through `medclaw.engine.trace.Trace.load`. Importing this package is light;
FastAPI is imported by `app.py` only.
"""
