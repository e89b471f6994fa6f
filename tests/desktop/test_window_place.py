"""The window comes back where it was left, end to end under Xvfb:

- a remembered geometry (window.json beside the config file the app was
  started with, logical pixels) is where "Open speedtap" opens the window: its size, and (with
  no window manager under Xvfb to place it elsewhere) its position;
- closing the window (WM_DELETE_WINDOW) writes the geometry it had back to
  window.json;
- a remembered size below the window's minimum (640x420) is ignored: the
  window opens at its default size, 1180x760.

Xvfb runs at scale 1, so logical pixels are X pixels here.
"""

import json
import os
import re
import subprocess
import unittest

from desktop import (Workdir, app_window, click, close_window, find_tray_item, start_app, wait_until,
                     window_processes, window_viewable)

# One route to a port nothing listens on: no traffic is needed here.
NO_SERVER = {"none": "http://127.0.0.1:9"}

DEFAULT_SIZE = (1180, 760)


def geometry(window):
    """(width, height, x, y) of `window` as X has it: its size and its
    absolute upper-left corner (xwininfo -id)."""
    info = subprocess.run(["xwininfo", "-id", hex(window)], capture_output=True, text=True, timeout=10).stdout

    def field(name):
        return int(re.search(rf"^\s*{name}:\s+(-?\d+)", info, re.M).group(1))

    return (field("Width"), field("Height"), field("Absolute upper-left X"), field("Absolute upper-left Y"))


class WindowPlaceTest(unittest.TestCase):
    def setUp(self):
        self.work = Workdir("window-place")
        self.addCleanup(self.work.close)
        # start_app's config file is in the work folder.
        self.state = os.path.join(self.work.path, "window.json")
        self.default_state = os.path.join(self.work.env()["XDG_CONFIG_HOME"], "speedtap", "window.json")

    def remember(self, **geometry):
        os.makedirs(os.path.dirname(self.state), exist_ok=True)
        with open(self.state, "w") as f:
            json.dump(geometry, f)

    def open_window(self):
        """Starts the app hidden, clicks "Open speedtap"; returns (app, tray
        item, X window) once the window is shown."""
        app, _, _, _ = start_app(self.work, NO_SERVER, extra=["--hidden"])
        item = find_tray_item(app.pid)
        self.assertIsNone(app_window(), "no window before it is opened")
        click(item, "Open speedtap")
        window = wait_until("the window", app_window)
        wait_until("the window shown", lambda: window_viewable(window))
        return app, item, window

    def test_the_window_opens_where_it_was_left_and_remembers_where_it_closed(self):
        """A remembered 900x640 at (40, 50) is the size and place the window
        opens at, and closing it writes that geometry back to window.json."""
        self.remember(width=900, height=640, x=40, y=50)
        app, _, window = self.open_window()
        # The size and place are set before the window is mapped, but a
        # GTK window can still settle after; wait for the requested one.
        seen = wait_until("the window at 900x640+40+50",
                          lambda: (lambda g: g if g == (900, 640, 40, 50) else None)(geometry(window)),
                          timeout=10)

        # Closing writes the window's geometry back. Remove the file first,
        # so what is read below can only be what the close wrote.
        os.remove(self.state)
        close_window(window)
        wait_until("the window destroyed", lambda: app_window() is None)
        wait_until("the window process gone", lambda: window_processes(app.pid) == [], timeout=30)
        self.assertTrue(os.path.exists(self.state), "closing the window writes window.json")
        self.assertFalse(os.path.exists(self.default_state),
                         "an app started with --config keeps the default config folder untouched")
        with open(self.state) as f:
            saved = json.load(f)
        self.assertEqual(set(saved), {"width", "height", "x", "y"}, saved)
        for key, value in zip(("width", "height", "x", "y"), seen):
            self.assertAlmostEqual(saved[key], value, delta=1,
                                   msg=f"window.json {saved} against X's {seen}")
        self.assertIsNone(app.poll(), "closing the window must not quit the app")

    def test_a_remembered_size_below_the_minimum_is_ignored(self):
        """A window.json holding 300x200 (below the 640x420 minimum) does not
        shrink the window: it opens at the default 1180x760."""
        self.remember(width=300, height=200, x=10, y=10)
        _, _, window = self.open_window()
        wait_until("the window at the default 1180x760",
                   lambda: (lambda g: g if g[:2] == DEFAULT_SIZE else None)(geometry(window)),
                   timeout=10)


if __name__ == "__main__":
    unittest.main()
