"""The tray app's life outside its engine, end to end under Xvfb:

- the tray process never loads GTK or WebKit; the window is a process of
  its own (speedtap-window), and it (and with it WebKit) exists
  only while the window is open: started with --hidden there is no WebKit
  process and no window; "Open speedtap" starts the window process, under
  which WebKit's processes run; opening again shows the same window;
  closing it ends the window process and every WebKit process, and the
  app stays in the tray; quitting the app ends the window process too;
- a second launch with the same config exits 0 and the first one's
  window is shown;
- "Start at login" in the tray creates the login entry
  ($XDG_CONFIG_HOME/autostart/speedtap.desktop) and removes it again.
"""

import os
import subprocess
import unittest

from desktop import (DESKTOP, Workdir, app_window, app_windows, click, close_window, descendants,
                     find_tray_item, maps_library, menu_entry, process_name, start_app, tray_label, wait_until, webkit_children,
                     window_processes, window_viewable)


# One route to a port nothing listens on: the app starts without probing
# for local servers, and no traffic is needed here.
NO_SERVER = {"none": "http://127.0.0.1:9"}


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.work = Workdir("lifecycle")
        self.addCleanup(self.work.close)

    def test_the_window_is_a_process_of_its_own_that_takes_webkit_with_it_when_closed(self):
        app, _, _, _ = start_app(self.work, NO_SERVER, extra=["--hidden"])
        # The tray exists once the app's setup has run; a window made at
        # start would have been made by then.
        item = find_tray_item(app.pid)
        self.assertEqual(webkit_children(app.pid), [], "no WebKit process before the window is opened")
        for library in ("libwebkit2gtk", "libgtk-3"):
            self.assertFalse(maps_library(app.pid, library), f"the tray process never loads {library}")
        self.assertEqual(window_processes(app.pid), [], "no window process before the window is opened")
        self.assertIsNone(app_window(), "no window before it is opened")

        click(item, "Open speedtap")
        window = wait_until("the window", app_window)
        wait_until("the window shown", lambda: window_viewable(window))
        [process] = wait_until("one window process", lambda: window_processes(app.pid))
        webkit = wait_until("WebKit's processes", lambda: webkit_children(app.pid))
        self.assertTrue(set(webkit) <= set(descendants(process)),
                        f"WebKit's processes {webkit} run under the window process {process}")

        # Opening again shows the same window: the second window process
        # hands over to the first and exits (saying so on the app's stderr).
        click(item, "Open speedtap")
        wait_until("the second window process handing over",
                   lambda: "the window is already open" in self.work.log("app"))
        wait_until("the second window process gone", lambda: window_processes(app.pid) == [process])
        self.assertEqual(app_windows(), 1)

        close_window(window)
        wait_until("the window destroyed", lambda: app_window() is None)
        wait_until("the window process gone", lambda: window_processes(app.pid) == [], timeout=30)
        wait_until("every WebKit process gone", lambda: webkit_children(app.pid) == [], timeout=30)
        self.assertIsNone(app.poll(), "closing the window must not quit the app")
        for library in ("libwebkit2gtk", "libgtk-3"):
            self.assertFalse(maps_library(app.pid, library), f"the tray process never loads {library}")
        self.assertTrue(tray_label(item), "the tray item is still there")

        # And it opens again.
        click(item, "Open speedtap")
        window = wait_until("the window again", app_window)
        wait_until("the window shown again", lambda: window_viewable(window))
        [process] = wait_until("the new window process", lambda: window_processes(app.pid))

        # Quitting the tray app takes the window process with it.
        click(item, "Quit")
        self.assertEqual(app.wait(timeout=30), 0)
        wait_until("the window process ended with the app", lambda: process_name(process) == "", timeout=30)
        wait_until("the window gone", lambda: app_window() is None)

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
        wait_until("the first app's window process (the window belongs to it)", lambda: window_processes(app.pid))
        wait_until("its web process", lambda: webkit_children(app.pid))
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
