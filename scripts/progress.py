#!/usr/bin/env python3
"""Run a `pip download` / `pip install` command and report download progress
in a way that also works in CI logs (stdout not a terminal).

Usage: progress.py [--prefix TEXT] [--interval SECONDS] -- PIP-COMMAND...

pip's own progress bar is drawn only on a terminal, so in a CI log a long
download is silent. This helper (standard library only) runs the pip command
as a child process and:

  * reads pip's stdout line by line and passes it through. pip announces each
    file it fetches with "Downloading NAME (SIZE)" (or "Using cached NAME
    (SIZE)"); SIZE is the server's Content-Length, rounded by pip (e.g.
    "98.4 MB"), which is close enough for a percentage and an ETA. When the
    server sends no length the line has no SIZE: we then show bytes and rate
    only.
  * gives the child a private TMPDIR. pip streams every download into
    $TMPDIR/pip-unpack-*/NAME before copying it to its destination, so the
    size of that file is the number of bytes received so far. A thread
    polls it and prints "done / total (percent), rate, ETA".
  * a download ends when pip prints its next line (pip prints nothing while
    it downloads with `--progress-bar off`) or exits; a summary line follows.

This relies only on pip's user-visible log line and on pip honouring TMPDIR,
not on pip's internal (private) API, so a pip that words things differently
degrades to "no progress", never to a failed download. Pass pip
`--progress-bar off` so that its tty bar does not fight with ours.
(Resolving each wheel's URL and fetching it ourselves would show exact sizes
but bypass pip's own settings: index URL, find-links, certificates, proxies,
credentials. `pip download` has no --dry-run, and pip 23's install --report
carries no sizes.)

Output: with stdout not a terminal, one line every --interval seconds
(default 3) per running download, no carriage returns. On a terminal, a
single line updated in place twice a second.

The exit status is the child's (128 + N when it is killed by signal N).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# "Downloading URL-or-NAME (98.4 MB)", "Using cached NAME (12 kB)"; pip 20+.
ANNOUNCE = re.compile(
    r"^\s*(?P<verb>Downloading|Using cached)\s+(?P<url>\S+)"
    r"(?:\s+\((?P<num>[0-9.]+)\s*(?P<unit>bytes|kB|MB|GB)\))?\s*$"
)
UNITS = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
RATE_WINDOW = 10.0  # seconds of samples the rate (and so the ETA) is based on


def human_bytes(n):
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d B" % n


def human_duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % divmod(seconds, 60)
    hours, rest = divmod(seconds, 3600)
    return "%dh%02dm" % (hours, rest // 60)


class Download:
    def __init__(self, name, total, cached):
        self.name = name
        self.total = total  # bytes (approximate), or None when unknown
        self.cached = cached
        self.start = time.monotonic()
        self.done = 0
        self.samples = [(self.start, 0)]  # (time, bytes) for the rate

    def observe(self, size):
        now = time.monotonic()
        self.done = max(self.done, size)
        self.samples.append((now, self.done))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.pop(0)

    def rate(self):
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def status(self):
        parts = [human_bytes(self.done)]
        if self.total:
            pct = min(100, int(100 * self.done / self.total))
            parts[0] += " / %s (%d%%)" % (human_bytes(self.total), pct)
        rate = self.rate()
        parts.append("%s/s" % human_bytes(rate))
        if self.total and rate > 0:
            left = max(0, self.total - self.done)
            parts.append("ETA %s" % human_duration(left / rate))
        elif self.total:
            parts.append("ETA unknown (stalled)")
        return "%s: %s" % (self.name, ", ".join(parts))

    def summary(self, complete):
        elapsed = time.monotonic() - self.start
        if not complete:
            total = " of %s" % human_bytes(self.total) if self.total else ""
            return "%s: stopped after %s%s (%s)" % (
                self.name, human_bytes(self.done), total, human_duration(elapsed))
        source = " from pip's cache" if self.cached else ""
        avg = " (%s/s)" % human_bytes(self.done / elapsed) if elapsed > 0 else ""
        return "%s: %s%s in %s%s" % (
            self.name, human_bytes(self.done), source, human_duration(elapsed), avg)


class Reporter:
    def __init__(self, prefix, interval, watch_dir, out):
        self.prefix = prefix
        self.tty = out.isatty()
        # On a terminal: redraw one line often. Elsewhere: a line every interval.
        self.interval = 0.5 if self.tty else interval
        self.watch_dir = watch_dir
        self.out = out
        self.lock = threading.Lock()
        self.current = None
        self.last_print = 0.0
        self.status_shown = False  # tty: an unterminated status line is on screen
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    # -- output -----------------------------------------------------------
    def _clear_status(self):
        if self.status_shown:
            self.out.write("\r\033[K")
            self.status_shown = False

    def _line(self, text):
        self._clear_status()
        self.out.write(text + "\n")
        self.out.flush()

    def passthrough(self, line):
        """A line of pip's output: it also marks the end of any running download."""
        with self.lock:
            self._finish()
            m = ANNOUNCE.match(line)
            if m:
                self._start(m)
            self._line(line.rstrip("\n"))

    # -- downloads --------------------------------------------------------
    def _start(self, m):
        url = m.group("url").split("#", 1)[0].split("?", 1)[0]
        name = url.rstrip("/").rsplit("/", 1)[-1] or url
        total = None
        if m.group("num"):
            total = int(float(m.group("num")) * UNITS[m.group("unit")])
        self.current = Download(name, total, m.group("verb") == "Using cached")
        self.last_print = time.monotonic()

    def _finish(self, complete=True):
        d, self.current = self.current, None
        if d is None:
            return
        size = self._file_size(d.name)
        if size is not None:
            d.observe(size)
        # Small or instant files (metadata, cache hits) need no summary line.
        if time.monotonic() - d.start >= 1.0 or d.done >= 1000**2:
            self._line("%s %s" % (self.prefix, d.summary(complete)))

    def _file_size(self, name):
        """Size of the file pip is writing for NAME, else of the newest file in
        a pip-unpack-* folder (the server may have renamed it), else None."""
        newest = None
        try:
            tops = [e for e in os.scandir(self.watch_dir)
                    if e.is_dir() and e.name.startswith("pip-unpack-")]
            for top in tops:
                for dirpath, _dirs, files in os.walk(top.path):
                    for f in files:
                        try:
                            st = os.stat(os.path.join(dirpath, f))
                        except OSError:
                            continue
                        if f == name:
                            return st.st_size
                        if newest is None or st.st_mtime > newest[0]:
                            newest = (st.st_mtime, st.st_size)
        except OSError:
            return None
        return newest[1] if newest else None

    def _poll(self):
        tick = min(0.5, self.interval)
        while not self.stop.wait(tick):
            with self.lock:
                d = self.current
                if d is None:
                    continue
                size = self._file_size(d.name)
                if size is not None:
                    d.observe(size)
                now = time.monotonic()
                if now - self.last_print < self.interval:
                    continue
                self.last_print = now
                text = "%s %s" % (self.prefix, d.status())
                if self.tty:
                    self.out.write("\r" + text + "\033[K")
                    self.status_shown = True
                    self.out.flush()
                else:
                    self._line(text)

    def close(self, success):
        self.stop.set()
        self.thread.join()
        with self.lock:
            self._finish(complete=success)
            self._clear_status()
            self.out.flush()


class Terminated(Exception):
    """SIGTERM (e.g. the calling script was killed): stop pip, clean up."""


def on_sigterm(_signum, _frame):
    raise Terminated()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default="[progress]", help="prefix of progress lines")
    ap.add_argument("--interval", type=float, default=3.0,
                    help="seconds between progress lines when stdout is not a terminal")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the pip command")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")

    signal.signal(signal.SIGTERM, on_sigterm)
    watch_dir = tempfile.mkdtemp(prefix="progress-")
    env = dict(os.environ, TMPDIR=watch_dir, PYTHONUNBUFFERED="1")
    reporter = Reporter(args.prefix, max(0.5, args.interval), watch_dir, sys.stdout)
    try:
        try:
            child = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env,
                                     universal_newlines=True, errors="replace", bufsize=1)
        except OSError as e:
            sys.stderr.write("progress.py: cannot run %s: %s\n" % (cmd[0], e))
            return 127
        reporter.thread.start()
        try:
            for line in child.stdout:
                reporter.passthrough(line)
            code = child.wait()
        except (KeyboardInterrupt, Terminated) as e:
            # On Ctrl-C the child got the same SIGINT (same process group) and
            # stops by itself; otherwise (or if it does not) stop it.
            sig = signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM
            try:
                child.wait(timeout=5 if sig == signal.SIGINT else 0)
            except subprocess.TimeoutExpired:
                child.terminate()
                child.wait()
            code = -sig
        reporter.close(code == 0)
    finally:
        shutil.rmtree(watch_dir, ignore_errors=True)
    return 128 + -code if code < 0 else code


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends us quietly
    sys.exit(main())
