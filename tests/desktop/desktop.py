"""Helpers for the tray app's end-to-end tests (stdlib only).

The tests run inside `xvfb-run -a dbus-run-session`, as scripts/test-desktop
starts them: an X display and a private session bus, nothing else. They
drive the real binaries:
- `speedtap simulate` is the model server (scripted timings);
- `speedtap-desktop` proxies to it; the tests stream chat completions
  through the app's route with http.client;
- the tray is read and clicked over D-Bus (`busctl --user --json=short`):
  on Linux it is a StatusNotifierItem the app exports itself (src-tauri/src/sni.rs),
  its label in `XAyatanaLabel`, its menu under `<item>/Menu` as
  com.canonical.dbusmenu.

Every app gets its own ports, config file and XDG directories, so runs do
not touch the user's settings and can share a machine.
"""

import ctypes
import ctypes.util
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("SPEEDTAP_TARGET_DIR", os.path.join(ROOT, "target", "debug"))
SPEEDTAP = os.path.join(TARGET, "speedtap")
DESKTOP = os.path.join(TARGET, "speedtap-desktop")
WINDOW = os.path.join(TARGET, "speedtap-window")

# The tray's rate label: one stream's own rate (`41.7 tok/s`), or with
# several, each model's (`sim-model 20`, `gemma 15 · qwen3 40`); `~` marks
# a rate on an estimated count. Group 1 is the first figure.
RATE_LABEL = re.compile(r"^(?:\S+ ~?(\d+(?:\.\d)?)(?: · \S+ ~?\d+(?:\.\d)?)*|~?(\d+(?:\.\d)?) tok/s)$")


def label_rate(label):
    """The first rate figure in a tray label, or None when it shows none."""
    m = RATE_LABEL.match(label or "")
    return float(m.group(1) or m.group(2)) if m else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, fn, timeout=20.0, interval=0.1):
    """Polls `fn` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # not ready yet: keep the reason for the failure message
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


class Workdir:
    """A temp dir holding logs, configs and the XDG dirs of one test."""

    def __init__(self, name):
        self.path = tempfile.mkdtemp(prefix=f"speedtap-desktop-{name}-")
        self.procs = []

    def file(self, name, text=None):
        p = os.path.join(self.path, name)
        if text is not None:
            with open(p, "w") as f:
                f.write(text)
        return p

    def env(self):
        env = dict(os.environ)
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
            d = os.path.join(self.path, var.lower())
            os.makedirs(d, exist_ok=True)
            env[var] = d
        # The system's autostart folders too: an installed package's
        # /etc/xdg/autostart entry must not change what the tests see.
        d = os.path.join(self.path, "xdg_config_dirs")
        os.makedirs(d, exist_ok=True)
        env["XDG_CONFIG_DIRS"] = d
        env.setdefault("NO_AT_BRIDGE", "1")
        return env

    def spawn(self, name, argv, **kw):
        path = os.path.join(self.path, f"{name}.log")
        with open(path, "wb") as log:  # the child keeps its own copy of the fd
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=kw.pop("env", self.env()), **kw)
        p.log_path = path
        self.procs.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.path, f"{name}.log"), "rb") as f:
            return f.read().decode("utf-8", "replace")

    def close(self, keep=bool(os.environ.get("SPEEDTAP_KEEP_TEST_DIRS"))):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if not keep:
            shutil.rmtree(self.path, ignore_errors=True)


def stop_app_with_arg(arg, timeout=10):
    """Stops the speedtap-desktop and speedtap-window processes whose
    command line has `arg` (a unique port): the ones tauri-driver started
    for a test."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) in (b"speedtap-desktop", b"speedtap-window") and arg.encode() in argv:
            os.kill(int(pid), 15)
            deadline = time.monotonic() + timeout
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.1)


def start_simulator(work, **flags):
    """`speedtap simulate` on a free port; returns its base URL once it answers."""
    port = free_port()
    argv = [SPEEDTAP, "simulate", "--listen", f"127.0.0.1:{port}"]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    work.spawn("simulate", argv)
    base = f"http://127.0.0.1:{port}"
    wait_until("the simulator", lambda: urllib.request.urlopen(base + "/health", timeout=1).status == 200)
    return base


def start_app(work, routes, extra=(), config_text="", name="app"):
    """The tray app with `routes` ({name: upstream}) on free ports, a temp
    config file and a free API port. Returns (process, {route: proxy_url}, api_url, config_path)."""
    config = work.file(f"{name}-config.toml", config_text)
    api = f"127.0.0.1:{free_port()}"
    proxies = {}
    argv = [DESKTOP, "--config", config, "--api", api]
    for route, upstream in routes.items():
        listen = f"127.0.0.1:{free_port()}"
        proxies[route] = f"http://{listen}"
        argv += ["--route", f"{route}={listen}={upstream}"]
    argv += list(extra)
    p = work.spawn(name, argv)
    api_url = f"http://{api}"

    def up():
        if p.poll() is not None:
            raise AssertionError(f"the app exited with {p.returncode}:\n{work.log(name)}")
        return urllib.request.urlopen(api_url + "/api/v1/stats", timeout=1).status == 200

    wait_until("the app's engine", up, timeout=30)
    return p, proxies, api_url, config


def stream_chat(proxy_url, model="qwen3:8b", headers=None, timeout=60):
    """One streamed OpenAI chat completion through `proxy_url`; returns the body."""
    host = proxy_url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=timeout)
    body = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = resp.read().decode("utf-8", "replace")
    conn.close()
    if resp.status != 200:
        raise AssertionError(f"HTTP {resp.status}: {data[:300]}")
    return data


def stream_in_background(proxy_url, count=1, **kw):
    """Starts `count` streams in threads; returns the threads (join them)."""
    threads = [threading.Thread(target=stream_chat, args=(proxy_url,), kwargs=kw, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def api_get(api_url, path):
    with urllib.request.urlopen(api_url + path, timeout=5) as r:
        return json.loads(r.read())


# ---- D-Bus: the StatusNotifierItem and its dbusmenu ------------------------

def busctl(*args):
    out = subprocess.run(["busctl", "--user", "--json=short", "--", *args], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise RuntimeError(f"busctl {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout) if out.stdout.strip() else None


def find_tray_item(pid, timeout=20):
    """(bus name, object path) of the StatusNotifierItem the process `pid` exports."""

    def look():
        names = busctl("call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                       "org.freedesktop.DBus", "ListNames")["data"][0]
        for name in names:
            if not name.startswith(":"):
                continue
            try:
                owner = busctl("call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                               "GetConnectionUnixProcessID", "s", name)["data"][0]
            except RuntimeError:
                continue
            if owner != pid:
                continue
            tree = subprocess.run(["busctl", "--user", "--list", "tree", name],
                                  capture_output=True, text=True, timeout=10).stdout.split()
            for path in tree:
                if path.startswith("/org/ayatana/NotificationItem/") and not path.endswith("/Menu"):
                    return name, path
        return None

    return wait_until(f"the tray item of pid {pid} on the session bus", look, timeout=timeout, interval=0.3)


def tray_label(item):
    name, path = item
    return busctl("get-property", name, path, "org.kde.StatusNotifierItem", "XAyatanaLabel")["data"]


def tray_property(item, prop):
    name, path = item
    return busctl("get-property", name, path, "org.kde.StatusNotifierItem", prop)["data"]


def _entries(node):
    """Flattens a dbusmenu layout node (id, props, children) into dicts."""
    ident, props, children = node
    flat = {k: v["data"] for k, v in props.items()}
    flat["id"] = ident
    out = [flat]
    for child in children:
        out += _entries(child["data"])
    return out


def menu_entries(item):
    """The menu's entries below the root: dicts with id, label, enabled, toggle-state, type."""
    name, path = item
    reply = busctl("call", name, path + "/Menu", "com.canonical.dbusmenu", "GetLayout", "iias", "0", "-1", "0")
    entries = _entries(reply["data"][1])[1:]
    for e in entries:
        e.setdefault("enabled", True)
        e.setdefault("visible", True)
        e["label"] = e.get("label", "").replace("_", "") if e.get("type") != "separator" else ""
    return [e for e in entries if e["visible"]]


def menu_labels(item):
    return [e["label"] for e in menu_entries(item) if e.get("type") != "separator"]


def menu_entry(item, label_prefix):
    for e in menu_entries(item):
        if e["label"].startswith(label_prefix):
            return e
    raise AssertionError(f"no menu entry starting with {label_prefix!r} in {menu_labels(item)}")


def click(item, label_prefix):
    """Clicks a menu entry as a tray host would (dbusmenu Event "clicked").

    The app rebuilds its menu when calls start or end, which renumbers the
    dbusmenu ids: a click can race with that and name an id that no longer
    exists. The exporter refuses such a click (nothing happened), so the
    layout is read again and the click retried."""
    name, path = item
    for attempt in range(5):
        entry = menu_entry(item, label_prefix)
        try:
            busctl("call", name, path + "/Menu", "com.canonical.dbusmenu", "Event", "isvu",
                   str(entry["id"]), "clicked", "s", "", "0")
            return entry
        except RuntimeError as e:
            if "does not refer to a menu item" not in str(e) or attempt == 4:
                raise
            time.sleep(0.1)


# ---- processes: the app and WebKit's helpers --------------------------------

def descendants(pid):
    """The pids of every process below `pid` (children, theirs...)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces.
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def process_name(pid):
    """The executable's base name (WebKit's helpers' `comm` is cut at 15 chars)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode("utf-8", "replace")
        return os.path.basename(argv0)
    except OSError:
        return ""


def webkit_children(pid, kind="WebKit"):
    """WebKit's processes under `pid` whose name starts with `kind`:
    `WebKit` for all, `WebKitWebProcess` for the webviews' own (the page),
    `WebKitNetworkProcess` for the one shared network process."""
    return [p for p in descendants(pid) if process_name(p).startswith(kind)]


def window_processes(pid):
    """The window processes under the tray app `pid` (`speedtap-window
    --window-of URL`, which it starts to show its window)."""
    out = []
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--window-of" in argv:
            out.append(p)
    return out


def maps_library(pid, name):
    """True when the process `pid` has a library whose file name starts
    with `name` mapped (`libgtk-3`, `libwebkit2gtk`)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(os.path.basename(line.split()[-1]).startswith(name) for line in f if "/" in line)
    except OSError:
        return False


# ---- X11: the app's window --------------------------------------------------

def app_window(title="speedtap"):
    """The X id of the top-level window titled `title` (the app's main
    window; the tray's XEmbed fallback and GTK's leader window have other
    names)."""
    tree = subprocess.run(["xwininfo", "-root", "-tree"], capture_output=True, text=True, timeout=10).stdout
    for line in tree.splitlines():
        m = re.match(r'\s*(0x[0-9a-f]+) "([^"]*)": \(', line)
        if m and m.group(2) == title:
            return int(m.group(1), 16)
    return None


def app_windows(title="speedtap"):
    """How many top-level windows are titled `title`."""
    tree = subprocess.run(["xwininfo", "-root", "-tree"], capture_output=True, text=True, timeout=10).stdout
    return sum(1 for line in tree.splitlines()
               if (m := re.match(r'\s*(0x[0-9a-f]+) "([^"]*)": \(', line)) and m.group(2) == title)


def window_viewable(window):
    info = subprocess.run(["xwininfo", "-id", hex(window)], capture_output=True, text=True, timeout=10).stdout
    return "Map State: IsViewable" in info


class _ClientMessage(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("serial", ctypes.c_ulong),
        ("send_event", ctypes.c_int),
        ("display", ctypes.c_void_p),
        ("window", ctypes.c_ulong),
        ("message_type", ctypes.c_ulong),
        ("format", ctypes.c_int),
        ("data", ctypes.c_long * 5),
    ]


class _XEvent(ctypes.Union):
    _fields_ = [("xclient", _ClientMessage), ("pad", ctypes.c_long * 24)]


def close_window(window):
    """Asks `window` to close the way a window manager's close button does:
    a WM_PROTOCOLS client message carrying WM_DELETE_WINDOW (Xlib through
    ctypes; the Xvfb session has no window manager to click)."""
    x11 = ctypes.CDLL(ctypes.util.find_library("X11") or "libX11.so.6")
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XInternAtom.restype = ctypes.c_ulong
    x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x11.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long, ctypes.POINTER(_XEvent)]
    x11.XFlush.argtypes = [ctypes.c_void_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    display = x11.XOpenDisplay(None)
    if not display:
        raise RuntimeError("cannot open the X display")
    try:
        event = _XEvent()
        event.xclient.type = 33  # ClientMessage
        event.xclient.window = window
        event.xclient.message_type = x11.XInternAtom(display, b"WM_PROTOCOLS", 0)
        event.xclient.format = 32
        event.xclient.data[0] = x11.XInternAtom(display, b"WM_DELETE_WINDOW", 0)
        event.xclient.data[1] = 0  # CurrentTime
        if not x11.XSendEvent(display, window, 0, 0, ctypes.byref(event)):
            raise RuntimeError("XSendEvent failed")
        x11.XFlush(display)
    finally:
        x11.XCloseDisplay(display)
