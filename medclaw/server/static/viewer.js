// MedClaw audit viewer. One script for two pages:
// - the service's page (/): jobs API with a bearer token, live steps over server-sent events;
// - a case file written by `medclaw trace html`: the view and its thumbnails embedded in the page.
// Everything a model wrote is inserted as text (textContent), never as HTML.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "style") Object.assign(node.style, value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const fmtTime = (t) => {
    if (typeof t !== "number" || !isFinite(t)) return "?";
    const m = Math.floor(t / 60), s = t - 60 * m;
    return `${String(m).padStart(2, "0")}:${s.toFixed(1).padStart(4, "0")}`;
  };
  const pct = (t, duration) => `${Math.max(0, Math.min(100, (100 * t) / (duration || 1)))}%`;
  const short = (text, n) => (text && text.length > n ? text.slice(0, n - 1) + "…" : text || "");

  // ------------------------------------------------------------------ rendering a case view

  // `thumbs.load(key, img)` fills an <img> with the JPEG of a thumbnail key.
  function renderCase(root, view, job, thumbs) {
    root.replaceChildren();
    root.append(renderSummary(view, job));
    root.append(el("section", { class: "card timeline-card" }, el("h2", {}, "Timeline"),
      el("div", { id: "timeline" })));
    root.append(el("section", { class: "card", id: "answer" }));
    root.append(el("section", { id: "steps", class: "steps" }));
    renderTimeline(view);
    renderAnswer(view, job);
    const steps = $("steps");
    for (const step of view.steps) steps.append(renderStep(step, view, thumbs));
  }

  function renderSummary(view, job) {
    const video = view.video || {};
    const models = Object.entries(view.models || {}).map(([role, m]) =>
      el("li", {}, el("b", {}, role), ` ${m.name || "?"} (${m.backend || "?"}) rev `,
        el("code", {}, short(m.revision || "-", 24))));
    const status = job ? job.status : view.answer ? view.answer.status : "unfinished";
    return el("section", { class: "card summary" },
      el("h2", {}, "Question ", el("span", { class: `badge ${status}`, id: "status" }, status)),
      el("p", { class: "question" }, view.episode.question),
      el("p", { class: "meta" },
        `Video ${video.name || "?"} · ${(video.duration_s || 0).toFixed(1)} s at `,
        `${(video.fps || 0).toFixed(2)} fps · ${video.width}×${video.height} · sha256 `,
        el("code", { title: video.sha256 || "" }, short(video.sha256 || "", 17))),
      el("ul", { class: "models" }, models));
  }

  function renderTimeline(view) {
    const box = $("timeline");
    if (!box) return;
    const duration = view.video.duration_s || 1;
    box.replaceChildren();
    const axis = el("div", { class: "lane axis" }, el("span", { class: "lane-label" }, "time"));
    const track = el("div", { class: "track" });
    for (let k = 0; k <= 10; k++) {
      const t = (duration * k) / 10;
      track.append(el("span", { class: "tick-label", style: { left: pct(t, duration) } }, fmtTime(t)));
    }
    axis.append(track);
    box.append(axis);
    for (const step of view.steps) {
      const lane = el("div", { class: "lane", "data-step": step.index,
        onclick: () => focusStep(step.index) });
      lane.append(el("span", { class: "lane-label" }, `#${step.index} ${step.tool || "(no call)"}`));
      const laneTrack = el("div", { class: "track" });
      for (const w of step.windows) {
        const width = Math.max(0.4, (100 * (w.end_s - w.start_s)) / duration);
        laneTrack.append(el("span", {
          class: `window ${w.kind}`, title: `${w.label}: ${fmtTime(w.start_s)}–${fmtTime(w.end_s)}`,
          style: { left: pct(w.start_s, duration), width: `${width}%` } }));
      }
      for (const f of step.frames) {
        laneTrack.append(el("span", { class: `frame-tick${f.crop_box ? " zoom" : ""}`,
          title: `frame ${f.frame_index} at ${fmtTime(f.timestamp_s)}`,
          style: { left: pct(f.timestamp_s, duration) } }));
      }
      lane.append(laneTrack);
      box.append(lane);
    }
    if (view.answer && view.answer.evidence.length) {
      const lane = el("div", { class: "lane answer-lane" }, el("span", { class: "lane-label" }, "answer"));
      const laneTrack = el("div", { class: "track" });
      for (const ev of view.answer.evidence) {
        laneTrack.append(el("span", { class: "evidence-mark", title: `evidence ${fmtTime(ev.time_s)}`,
          style: { left: pct(ev.time_s, duration) } }));
      }
      lane.append(laneTrack);
      box.append(lane);
    }
  }

  function renderAnswer(view, job) {
    const box = $("answer");
    if (!box) return;
    box.replaceChildren(el("h2", {}, "Answer"));
    const answer = view.answer;
    if (!answer) {
      box.append(el("p", { class: "empty" },
        job && !["done", "failed", "cancelled"].includes(job.status)
          ? "The episode is running: steps appear below as they happen."
          : "The trace has no footer: the episode never finished."));
      return;
    }
    box.append(el("p", { class: "answer-text" }, answer.text || "(no answer)"));
    box.append(el("p", { class: "meta" }, `status ${answer.status}`,
      answer.forced_reason ? ` (${answer.forced_reason})` : "",
      answer.error ? ` — ${answer.error}` : ""));
    if (answer.evidence.length) {
      const list = el("ul", { class: "evidence" });
      for (const ev of answer.evidence) {
        const item = el("li", {}, `evidence at ${fmtTime(ev.time_s)} (${ev.time_s.toFixed(2)} s)`);
        if (ev.frame) {
          item.append(" → ", el("a", { href: "#", class: "evidence-link", "data-key": ev.frame.key,
            onclick: (e) => { e.preventDefault(); focusFrame(ev.frame.step, ev.frame.key); } },
          `frame at ${fmtTime(ev.frame.timestamp_s)} (step ${ev.frame.step})`));
        }
        list.append(item);
      }
      box.append(list);
    }
    const t = answer.totals || {};
    box.append(el("p", { class: "meta" }, `${t.steps ?? "?"} steps, ${t.errors ?? 0} errors, `,
      `${t.unique_frames ?? 0} unique frames, ${t.visual_tokens_used ?? 0} visual tokens, `,
      `cache hit rate ${(100 * (t.cached_hit_rate || 0)).toFixed(1)}%, wall ${(t.wall_s || 0).toFixed(1)} s`));
  }

  function callLine(label, call) {
    if (!call) return null;
    return el("li", {}, el("b", {}, label), ` ${call.model || "?"} rev `,
      el("code", {}, short(call.revision || "-", 24)),
      ` · ${call.prompt_tokens} prompt tok (${call.cached_tokens} cached), ${call.completion_tokens} out,`,
      ` ${Number(call.latency_s || 0).toFixed(2)} s`);
  }

  function renderStep(step, view, thumbs) {
    const card = el("article", { class: `card step${step.error ? " has-error" : ""}`,
      id: `step-${step.index}`, "data-step": step.index });
    card.append(el("h3", {}, `#${step.index} `, el("span", { class: "tool" }, step.tool || "(no valid call)"),
      step.kind === "forced_answer" ? el("span", { class: "badge forced" }, "forced") : null,
      el("span", { class: "meta" }, ` at ${Number(step.started_at_s || 0).toFixed(1)} s,`,
        ` tool ${Number(step.tool_latency_s || 0).toFixed(2)} s`)));
    if (step.thought) card.append(el("p", { class: "thought" }, step.thought));
    card.append(el("div", { class: "kv" }, el("b", {}, "Call "),
      el("code", { class: "args" }, JSON.stringify(step.args))));
    if (step.windows.length) {
      card.append(el("div", { class: "kv" }, el("b", {}, "Looked at "),
        step.windows.map((w) => el("span", { class: `chip ${w.kind}` },
          `${w.label} ${fmtTime(w.start_s)}${w.end_s > w.start_s ? "–" + fmtTime(w.end_s) : ""}`))));
    }
    if (step.error) card.append(el("pre", { class: "error" }, step.error));
    else card.append(el("pre", { class: "observation" }, step.observation));
    const calls = el("ul", { class: "calls" }, callLine("orchestrator", step.orchestrator),
      step.calls.map((c, n) => callLine(`sub-agent ${n + 1}`, c)));
    card.append(calls);
    if (step.calls.length) {
      const details = el("details", {}, el("summary", {}, "model replies"));
      step.calls.forEach((c, n) => details.append(el("pre", { class: "reply" }, `[${n + 1}] ${c.text}`)));
      card.append(details);
    }
    const shown = step.frames.filter((f) => f.shown);
    if (shown.length) {
      const strip = el("div", { class: "frames" });
      for (const f of shown) strip.append(renderFrame(f, thumbs));
      card.append(el("div", { class: "kv" }, el("b", {}, "Evidence frames "),
        el("span", { class: "meta" }, shown.length < step.frames_total
          ? `${shown.length} of ${step.frames_total} shown, evenly spaced` : `${shown.length}`)), strip);
    }
    return card;
  }

  function renderFrame(frame, thumbs) {
    const whole = el("img", { class: "thumb", alt: `frame ${frame.frame_index}`,
      "data-key": frame.frame_key });
    thumbs.load(frame.frame_key, whole);
    const holder = el("div", { class: "frame-holder" }, whole);
    if (frame.crop_box) {
      const [x1, y1, x2, y2] = frame.crop_box;
      holder.append(el("span", { class: "zoom-box", style: {
        left: `${100 * x1}%`, top: `${100 * y1}%`, width: `${100 * (x2 - x1)}%`, height: `${100 * (y2 - y1)}%` } }));
    }
    const figure = el("figure", { class: "frame", "data-key": frame.key, id: `frame-${frame.step}-${frame.key}` },
      holder);
    if (frame.crop_box) {
      const zoom = el("img", { class: "thumb zoomed", alt: `region of frame ${frame.frame_index}`,
        "data-key": frame.key });
      thumbs.load(frame.key, zoom);
      figure.append(zoom);
    }
    figure.append(el("figcaption", {}, `${fmtTime(frame.timestamp_s)} · #${frame.frame_index}`));
    return figure;
  }

  function focusStep(index) {
    const card = $(`step-${index}`);
    if (card) card.scrollIntoView({ behavior: "smooth", block: "start" });
  }

  function focusFrame(step, key) {
    const figure = $(`frame-${step}-${key}`);
    if (!figure) return;
    for (const old of document.querySelectorAll(".frame.highlight")) old.classList.remove("highlight");
    figure.classList.add("highlight");
    figure.scrollIntoView({ behavior: "smooth", block: "center" });
  }

  // ------------------------------------------------------------------ a case file (offline)

  function startCaseFile(data) {
    const thumbs = {
      load(key, img) {
        if (data.thumbs[key]) img.src = data.thumbs[key];
        else img.classList.add("missing");
      },
    };
    renderCase($("case"), data.view, null, thumbs);
  }

  // ------------------------------------------------------------------ the service page

  const api = {
    token: null,
    async call(path, options = {}) {
      const headers = Object.assign({ Authorization: `Bearer ${this.token}` }, options.headers || {});
      const response = await fetch(path, Object.assign({}, options, { headers }));
      if (response.status === 401) { showLogin("The token was refused."); throw new Error("unauthorised"); }
      if (!response.ok) {
        let detail = response.statusText;
        try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
        throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
      }
      return response;
    },
    async json(path, options) { return (await this.call(path, options)).json(); },
  };

  function notice(text, isError) {
    const box = $("notice");
    box.textContent = text || "";
    box.classList.toggle("error", !!isError);
  }

  function showLogin(message) {
    sessionStorage.removeItem("medclaw-token");
    $("app").hidden = true;
    $("login").hidden = false;
    if (message) notice(message, true);
  }

  // Thumbnails need the bearer token, so they are fetched and shown as blob: URLs; a few at a time.
  function serviceThumbs(jobId) {
    const urls = new Map(), queue = [];
    let active = 0;
    const pump = () => {
      while (active < 4 && queue.length) {
        const [key, img] = queue.shift();
        active++;
        const cached = urls.get(key);
        const url = cached ? Promise.resolve(cached) : api.call(
          `/api/jobs/${encodeURIComponent(jobId)}/frames/${encodeURIComponent(key)}`)
          .then((r) => r.blob()).then((b) => { const u = URL.createObjectURL(b); urls.set(key, u); return u; });
        url.then((u) => { img.src = u; }, (err) => { img.classList.add("missing"); img.title = String(err.message); })
          .finally(() => { active--; pump(); });
      }
    };
    return { load(key, img) { queue.push([key, img]); pump(); } };
  }

  const live = { jobId: null, abort: null, view: null, job: null, thumbs: null };

  async function openJob(jobId) {
    if (live.abort) live.abort.abort();
    live.jobId = jobId;
    live.abort = new AbortController();
    const signal = live.abort.signal;
    const root = $("case");
    root.replaceChildren(el("p", { class: "empty" }, "Loading…"));
    let data;
    try {
      data = await api.json(`/api/jobs/${encodeURIComponent(jobId)}/view`);
    } catch (err) { root.replaceChildren(el("p", { class: "error" }, String(err.message))); return; }
    if (live.jobId !== jobId) return;
    live.job = data.job;
    live.thumbs = serviceThumbs(jobId);
    live.view = data.view || pendingView(data.job);
    renderCase(root, live.view, live.job, live.thumbs);
    highlightJob(jobId);
    if (!["done", "failed", "cancelled"].includes(data.job.status) || !data.view || !data.view.answer) {
      follow(jobId, live.view.steps.length, signal).catch((err) => {
        if (!signal.aborted) notice(`live stream stopped: ${err.message}`, true);
      });
    }
  }

  function pendingView(job) {
    return { episode: { id: job.id, question: job.question, finished: false },
             video: { name: job.video.split("/").pop(), duration_s: 0 }, models: {}, steps: [], answer: null };
  }

  // Server-sent events read with fetch (EventSource cannot send the Authorization header).
  async function follow(jobId, after, signal) {
    const response = await api.call(`/api/jobs/${encodeURIComponent(jobId)}/events`,
      { headers: { "Last-Event-ID": String(after) }, signal });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        if (data && live.jobId === jobId) onEvent(event, JSON.parse(data));
      }
    }
  }

  function onEvent(event, data) {
    if (event === "job") {
      if (live.job && data.attempts !== live.job.attempts) live.view.steps = [];
      live.job = data;
      const badge = $("status");
      if (badge) { badge.textContent = data.status; badge.className = `badge ${data.status}`; }
      if (!live.view.steps.length && data.status === "running") {
        // the header (video, models) is there once the episode started: fetch it once
        api.json(`/api/jobs/${encodeURIComponent(data.id)}/view`).then((d) => {
          if (d.view && live.jobId === data.id && !live.view.video.sha256) {
            d.view.steps = live.view.steps;
            live.view = d.view;
            renderCase($("case"), live.view, live.job, live.thumbs);
          }
        }, () => {});
      }
      refreshJobs();
    } else if (event === "step") {
      const step = data.view;
      if (live.view.steps.some((s) => s.index === step.index)) return;
      live.view.steps.push(step);
      const steps = $("steps");
      if (steps) steps.append(renderStep(step, live.view, live.thumbs));
      renderTimeline(live.view);
    } else if (event === "end") {
      live.job = data.job;
      if (data.view) live.view = data.view;
      renderCase($("case"), live.view, live.job, live.thumbs);
      refreshJobs();
    }
  }

  function highlightJob(jobId) {
    for (const item of document.querySelectorAll("#jobs li")) {
      item.classList.toggle("selected", item.dataset.job === jobId);
    }
  }

  async function refreshJobs() {
    let data;
    try { data = await api.json("/api/jobs?limit=50"); } catch (err) { return; }
    const list = $("jobs");
    list.replaceChildren(...data.jobs.map((job) => el("li", { "data-job": job.id,
      class: job.id === live.jobId ? "selected" : null,
      onclick: () => { location.hash = `job=${job.id}`; } },
      el("span", { class: `badge ${job.status}` }, job.status), " ", short(job.question, 70),
      el("span", { class: "meta" }, ` · ${job.video.split("/").pop()}`))));
  }

  async function submitJob(event) {
    event.preventDefault();
    const button = $("submit-button");
    button.disabled = true;
    try {
      const question = $("question").value;
      const profile = $("profile").value || null;
      const file = $("video-file").files[0];
      const body = { question, profile };
      if (file) {
        notice(`uploading ${file.name}…`);
        const up = await api.json(`/api/uploads?filename=${encodeURIComponent(file.name)}`,
          { method: "POST", body: file, headers: { "Content-Type": "application/octet-stream" } });
        body.upload = up.upload;
      } else {
        body.video = $("video-path").value.trim();
      }
      const job = await api.json("/api/jobs", { method: "POST", body: JSON.stringify(body),
        headers: { "Content-Type": "application/json" } });
      notice(`job submitted`);
      location.hash = `job=${job.id}`;
      refreshJobs();
    } catch (err) {
      notice(String(err.message), true);
    } finally {
      button.disabled = false;
    }
  }

  async function startService() {
    const fromUrl = new URLSearchParams(location.hash.slice(1)).get("token");
    if (fromUrl) {
      sessionStorage.setItem("medclaw-token", fromUrl);
      history.replaceState(null, "", location.pathname);          // keep it out of the address bar
    }
    api.token = sessionStorage.getItem("medclaw-token");
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      sessionStorage.setItem("medclaw-token", $("token-input").value.trim());
      location.reload();
    });
    if (!api.token) { showLogin(); return; }
    let info;
    try { info = await api.json("/api/info"); } catch (err) {
      if (err.message !== "unauthorised") notice(String(err.message), true);   // else: login shown
      return;
    }
    $("login").hidden = true;
    $("app").hidden = false;
    $("profile").replaceChildren(...info.profiles.map((p) => el("option", { value: p }, p)));
    $("path-row").hidden = !info.accepts_paths;
    $("submit-form").addEventListener("submit", submitJob);
    $("refresh").addEventListener("click", refreshJobs);
    const route = () => {
      const id = new URLSearchParams(location.hash.slice(1)).get("job");
      if (id && id !== live.jobId) openJob(id);
    };
    window.addEventListener("hashchange", route);
    await refreshJobs();
    route();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const embedded = document.getElementById("medclaw-case");
    if (embedded) startCaseFile(JSON.parse(embedded.textContent));
    else startService();
  });
})();
