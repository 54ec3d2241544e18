#!/usr/bin/env python3
"""Opens fsdp-plan HTML reports in headless Chromium and checks that they render.

Speaks the Chrome DevTools protocol over --remote-debugging-pipe (file descriptors 3 and 4,
NUL-terminated JSON), Python standard library only. For each page it checks that:
  - the page loads with no console error, uncaught exception or blocked/failed resource load
    (the report must be self-contained: its Content-Security-Policy blocks every fetch);
  - each expected chart (an <svg> by id) is laid out with a non-zero size and holds visible marks
    (rects, circles or paths with a non-zero rendered box);
  - no element reaches outside the page horizontally;
and it saves a full-page screenshot (PNG) per page into the artefact directory.

usage: check_report.py --chromium PATH --out DIR [--docs-screenshot PNG] PAGE.html:chart-id,chart-id [...]
  --docs-screenshot: also save the first page from its top to the end of its #tradeoff section (the
  README's docs/report.png).
exit 0: all pages pass; 1: a check failed (each failure printed); 2: Chromium could not be driven.
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

WIDTH = 1140  # CSS pixels: the report's main column is 1100 px wide


class Browser:
    def __init__(self, chromium, user_data_dir):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4. The pipe ends are created
        # non-inheritable; the child makes inheritable copies at 3 and 4 (close_fds=False keeps them).
        def child_fds():
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)  # above 4, so neither dup2 clobbers the other
            os.dup2(r, 3)
            os.dup2(w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)
        self.stderr = tempfile.TemporaryFile()
        args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
                "--user-data-dir=" + user_data_dir, "--window-size=%d,900" % WIDTH, "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     preexec_fn=child_fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.next_id = 0
        self.buf = b""
        self.events = []
        self.replies = {}
        self.lock = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                chunk = os.read(self.from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            with self.lock:
                if not chunk:
                    self.replies[None] = "closed"
                    self.lock.notify_all()
                    return
                self.buf += chunk
                while b"\0" in self.buf:
                    msg, self.buf = self.buf.split(b"\0", 1)
                    m = json.loads(msg)
                    if "id" in m:
                        self.replies[m["id"]] = m
                    else:
                        self.events.append(m)
                self.lock.notify_all()

    def send(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        mid = self.next_id
        m = {"id": mid, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self.to_chrome, json.dumps(m).encode() + b"\0")
        deadline = time.time() + timeout
        with self.lock:
            while mid not in self.replies:
                if None in self.replies:
                    raise RuntimeError("Chromium closed the pipe during " + method)
                left = deadline - time.time()
                if left <= 0:
                    raise RuntimeError("no reply to " + method + " in %d s" % timeout)
                self.lock.wait(left)
            r = self.replies.pop(mid)
        if "error" in r:
            raise RuntimeError(method + ": " + json.dumps(r["error"]))
        return r.get("result", {})

    def wait_event(self, method, session, timeout=30):
        deadline = time.time() + timeout
        with self.lock:
            while True:
                for e in self.events:
                    if e.get("method") == method and e.get("sessionId") == session:
                        return e
                left = deadline - time.time()
                if left <= 0:
                    raise RuntimeError("no " + method + " in %d s" % timeout)
                self.lock.wait(left)

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except RuntimeError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# Runs in the page: sizes of the charts and of their marks, and anything wider than the page.
PROBE = r"""
(() => {
  const charts = {};
  for (const svg of document.querySelectorAll('svg.chart')) {
    const r = svg.getBoundingClientRect();
    let marks = 0, visible = 0;
    for (const el of svg.querySelectorAll('rect, circle, path, line')) {
      marks++;
      const b = el.getBoundingClientRect();
      if (b.width > 0 || b.height > 0) visible++;
    }
    charts[svg.id] = {width: r.width, height: r.height, marks: marks, visible: visible,
                      texts: svg.querySelectorAll('text').length};
  }
  // Anything that reaches outside its section's box (a table or chart too wide for the page).
  const wide = [];
  for (const sec of document.querySelectorAll('section')) {
    const right = sec.getBoundingClientRect().right;
    for (const el of sec.querySelectorAll('*')) {
      const b = el.getBoundingClientRect();
      if (b.right > right + 1 && wide.length < 5) wide.push(sec.id + ' ' + el.tagName + (el.id ? '#' + el.id : ''));
    }
  }
  return JSON.stringify({title: document.title, charts: charts, wide: wide,
                         sections: [...document.querySelectorAll('section')].map(s => s.id),
                         height: Math.ceil(document.documentElement.scrollHeight)});
})()
"""


def check_page(b, path, expected, out_dir, docs_png=None):
    failures = []
    url = "file://" + os.path.abspath(path)
    target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        b.send(domain + ".enable", session=session)
    b.send("Emulation.setDeviceMetricsOverride",
           {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
    with b.lock:
        first_event = len(b.events)
    b.send("Page.navigate", {"url": url}, session=session)
    b.wait_event("Page.loadEventFired", session)
    time.sleep(0.3)  # let late console messages arrive
    probe = json.loads(b.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True},
                              session=session)["result"]["value"])
    with b.lock:
        events = [e for e in b.events[first_event:] if e.get("sessionId") == session]
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            failures.append("uncaught exception: " + json.dumps(p.get("exceptionDetails", {}))[:300])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            failures.append("console error: " + json.dumps(p.get("args", []))[:300])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            failures.append("console error: " + p["entry"].get("text", "")[:300])
    if not probe["title"].startswith("fsdp-plan"):
        failures.append("unexpected title: %r" % probe["title"])
    for chart in expected:
        c = probe["charts"].get(chart)
        if c is None:
            failures.append("chart #%s is missing (charts: %s)" % (chart, ", ".join(probe["charts"])))
            continue
        if c["width"] < 200 or c["height"] < 50:
            failures.append("chart #%s is laid out %.0f x %.0f px" % (chart, c["width"], c["height"]))
        if c["visible"] < 5 or c["visible"] < c["marks"] // 2:
            failures.append("chart #%s: %d of %d marks are visible" % (chart, c["visible"], c["marks"]))
        if c["texts"] < 3:
            failures.append("chart #%s has %d text labels" % (chart, c["texts"]))
    if probe["wide"]:
        failures.append("elements wider than the page: " + ", ".join(probe["wide"]))
    # Full-page screenshot.
    height = min(max(probe["height"], 900), 16000)
    b.send("Emulation.setDeviceMetricsOverride",
           {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
    png = base64.b64decode(b.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"])
    shot = os.path.join(out_dir, os.path.splitext(os.path.basename(path))[0] + ".png")
    with open(shot, "wb") as f:
        f.write(png)
    if docs_png:
        box = json.loads(b.send("Runtime.evaluate", {"expression": "JSON.stringify(document.getElementById("
                                                     "'tradeoff').getBoundingClientRect())", "returnByValue": True},
                                session=session)["result"]["value"])
        clip = {"x": 0, "y": 0, "width": WIDTH, "height": box["bottom"] + 12, "scale": 1}
        data = b.send("Page.captureScreenshot", {"format": "png", "clip": clip}, session=session)["data"]
        with open(docs_png, "wb") as f:
            f.write(base64.b64decode(data))
    # One screenshot per section too (legible at full size).
    for sid in probe["sections"]:
        box = b.send("Runtime.evaluate", {"expression": "JSON.stringify(document.getElementById(%s)"
                                          ".getBoundingClientRect())" % json.dumps(sid), "returnByValue": True},
                     session=session)["result"]["value"]
        r = json.loads(box)
        clip = {"x": r["x"], "y": r["y"], "width": r["width"], "height": r["height"], "scale": 1}
        data = b.send("Page.captureScreenshot", {"format": "png", "clip": clip}, session=session)["data"]
        with open(shot[:-4] + "-" + sid + ".png", "wb") as f:
            f.write(base64.b64decode(data))
    if len(png) < 10000:
        failures.append("screenshot is suspiciously small (%d bytes)" % len(png))
    b.send("Target.closeTarget", {"targetId": target})
    summary = ", ".join("#%s %dx%d (%d marks)" % (k, v["width"], v["height"], v["visible"])
                        for k, v in probe["charts"].items())
    return failures, shot, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chromium", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs-screenshot", default=None)
    ap.add_argument("pages", nargs="+", help="PAGE.html:chart-id,chart-id")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="fsdp-report-chromium-")
    try:
        try:
            b = Browser(a.chromium, profile)
            b.send("Browser.getVersion", timeout=60)
        except (RuntimeError, OSError) as e:
            print("check_report: cannot drive Chromium: %s" % e, file=sys.stderr)
            return 2
        failed = False
        try:
            for i, spec in enumerate(a.pages):
                path, _, charts = spec.partition(":")
                failures, shot, summary = check_page(b, path, [c for c in charts.split(",") if c], a.out,
                                                     a.docs_screenshot if i == 0 else None)
                for f in failures:
                    print("FAIL %s: %s" % (path, f))
                if not failures:
                    print("ok   %s: %s; screenshot %s" % (path, summary, shot))
                failed = failed or bool(failures)
        finally:
            b.close()
        return 1 if failed else 0
    finally:
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
