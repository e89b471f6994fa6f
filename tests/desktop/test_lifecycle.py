"""The tray app's life outside its engine, end to end under Xvfb:

- the window (and with it WebKit) exists only while it is open: started
  with --hidden there is no WebKit process and no window; "Open speedtap"
  creates both; closing the window ends the webview's web process again
  (WebKit's one network process may stay, for the next window), and the
  app stays in the tray;
- a second launch with the same config exits 0 and the first one's
  window is shown;
- "Start at login" in the tray creates the login entry
  ($XDG_CONFIG_HOME/autostart/speedtap.desktop) and removes it again.
"""

import os
import subprocess
import unittest

from desktop import (DESKTOP, Workdir, app_window, click, close_window, find_tray_item, menu_entry, start_app,
                     tray_label, wait_until, webkit_children, window_viewable)


# One route to a port nothing listens on: the app starts without probing
# for local servers, and no traffic is needed here.
NO_SERVER = {"none": "http://127.0.0.1:9"}


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.work = Workdir("lifecycle")
        self.addCleanup(self.work.close)

    def test_the_webview_exists_only_while_the_window_is_open(self):
        app, _, _, _ = start_app(self.work, NO_SERVER, extra=["--hidden"])
        # The tray exists once the app's setup has run; a window made at
        # start would have been made by then.
        item = find_tray_item(app.pid)
        self.assertEqual(webkit_children(app.pid), [], "no WebKit process before the window is opened")
        self.assertIsNone(app_window(), "no window before it is opened")

        click(item, "Open speedtap")
        window = wait_until("the window", app_window)
        wait_until("the window shown", lambda: window_viewable(window))
        wait_until("WebKit's processes", lambda: webkit_children(app.pid))

        close_window(window)
        wait_until("the window destroyed", lambda: app_window() is None)
        wait_until("the webview's web process gone",
                   lambda: webkit_children(app.pid, "WebKitWebProcess") == [], timeout=30)
        # WebKitGTK keeps its network process once started, and Tauri keeps
        # its web context on Linux for the next window to reuse it: at most
        # that one process may stay.
        left = webkit_children(app.pid)
        self.assertLessEqual(len(left), 1, left)
        self.assertEqual(webkit_children(app.pid, "WebKitNetworkProcess"), left)
        self.assertIsNone(app.poll(), "closing the window must not quit the app")
        self.assertTrue(tray_label(item), "the tray item is still there")

        # And it opens again.
        click(item, "Open speedtap")
        window = wait_until("the window again", app_window)
        wait_until("the window shown again", lambda: window_viewable(window))

    def test_a_second_launch_exits_0_and_shows_the_first_ones_window(self):
        app, _, api_url, config = start_app(self.work, NO_SERVER, extra=["--hidden"])
        find_tray_item(app.pid)
        self.assertIsNone(app_window())
        second = subprocess.run([DESKTOP, "--config", config], env=self.work.env(), capture_output=True,
                                text=True, timeout=30)
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertIn("already running", second.stderr)
        window = wait_until("the first app's window", app_window)
        wait_until("the window shown", lambda: window_viewable(window))
        wait_until("the first app's web process (the window belongs to it)", lambda: webkit_children(app.pid))
        self.assertIsNone(app.poll())

    def test_start_at_login_in_the_tray_creates_and_removes_the_login_entry(self):
        app, _, _, _ = start_app(self.work, NO_SERVER, extra=["--hidden"])
        item = find_tray_item(app.pid)
        entry = os.path.join(self.work.env()["XDG_CONFIG_HOME"], "autostart", "speedtap.desktop")
        toggle = menu_entry(item, "Start at login")
        self.assertEqual(toggle.get("toggle-type"), "checkmark")
        self.assertEqual(toggle.get("toggle-state"), 0)
        self.assertFalse(os.path.exists(entry))

        click(item, "Start at login")
        wait_until("the login entry", lambda: os.path.exists(entry))
        with open(entry) as f:
            text = f.read()
        self.assertIn("[Desktop Entry]", text)
        exec_line = [l for l in text.splitlines() if l.startswith("Exec=")][0]
        self.assertIn(os.path.realpath(DESKTOP), exec_line)
        self.assertTrue(exec_line.endswith("--hidden"), exec_line)
        wait_until("the check mark", lambda: menu_entry(item, "Start at login").get("toggle-state") == 1)

        click(item, "Start at login")
        wait_until("the login entry removed", lambda: not os.path.exists(entry))
        wait_until("the check mark cleared", lambda: menu_entry(item, "Start at login").get("toggle-state") == 0)


if __name__ == "__main__":
    unittest.main()
