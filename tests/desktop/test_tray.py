"""The tray over D-Bus (StatusNotifierItem + dbusmenu), with real traffic:
the label shows a rate while tokens flow, the menu has its entries (a line
per call in flight, the hour's high/low, Open, Pause, Start at login, one
Copy per route, Quit), Copy puts the proxy URL on the clipboard, and Quit
exits 0. Calls in flight keep their place in the menu, in start order, as
their lines update. A port taken at start does not stop the app: the tray names it.
With no route configured, a model server started after the app is listed
in the menu and measured, and shown down when it stops."""

import os
import shutil
import socket
import subprocess
import time
import unittest

from desktop import (DESKTOP, SPEEDTAP, Workdir, api_get, app_window, click, close_window, find_tray_item, free_port,
                     menu_entries, menu_labels, start_app, start_simulator, stream_chat, stream_in_background,
                     label_rate, tray_label, tray_property, wait_until, window_viewable)


class TrayTest(unittest.TestCase):
    def setUp(self):
        self.work = Workdir("tray")
        self.addCleanup(self.work.close)
        # 20 tok/s for 120 tokens: each call streams for 6 s.
        self.sim = start_simulator(self.work, tps=20, tokens=120, ttft_ms=300)

    def test_label_menu_copy_and_quit(self):
        app, proxies, _, _ = start_app(self.work, {"sim": self.sim, "other": self.sim})
        item = find_tray_item(app.pid)

        # Idle: no number, the idle icon, the fixed entries.
        self.assertEqual(tray_label(item), "idle")
        self.assertTrue(tray_property(item, "Title").startswith("speedtap"))
        labels = menu_labels(item)
        self.assertEqual(labels, [
            "No calls in flight",
            "Last hour: no readings yet",
            "Open speedtap",
            "Pause notifications",
            "Start at login",
            "Copy proxy URL (sim)",
            "Copy proxy URL (other)",
            "Quit",
        ])
        pause = [e for e in menu_entries(item) if e["label"] == "Pause notifications"][0]
        self.assertEqual(pause.get("toggle-type"), "checkmark")
        self.assertEqual(pause.get("toggle-state"), 0)
        idle_icon = tray_property(item, "IconPixmap")

        # Traffic through the app's proxy: the label becomes a rate.
        threads = stream_in_background(proxies["sim"], count=2)
        label = wait_until("a tok/s label", lambda: (lambda l: l if label_rate(l) else None)(tray_label(item)))
        rate = label_rate(label)
        self.assertGreater(rate, 5.0, label)
        self.assertLess(rate, 40.0, label)
        self.assertNotEqual(tray_property(item, "IconPixmap"), idle_icon, "the icon shows streaming")

        # The menu lists the calls with model, phase and rate.
        def call_lines():
            lines = [l for l in menu_labels(item) if l.startswith("qwen3:8b on sim")]
            return lines if len(lines) == 2 and all("tok/s" in l for l in lines) else None

        lines = wait_until("two call lines with a rate", call_lines)
        self.assertRegex(lines[0], r"^qwen3:8b on sim · responding · ~?\d+\.\d tok/s$")

        # The label changes no more often than the 1 s publishing cadence.
        changes, last, t_end = 0, tray_label(item), time.monotonic() + 3.0
        while time.monotonic() < t_end:
            now = tray_label(item)
            if now != last:
                changes, last = changes + 1, now
            time.sleep(0.05)
        self.assertLessEqual(changes, 4, "label updates at the global cadence, not per snapshot")

        for t in threads:
            t.join(30)
        wait_until("the hour's high/low in the menu",
                   lambda: any(l.startswith("Last hour: high ") for l in menu_labels(item)))
        wait_until("no calls in flight", lambda: "No calls in flight" in menu_labels(item), timeout=15)

        # Copy proxy URL puts the route's URL on the clipboard.
        if shutil.which("xclip"):
            click(item, "Copy proxy URL (other)")
            got = wait_until("the clipboard", lambda: subprocess.run(
                ["xclip", "-o", "-selection", "clipboard"], capture_output=True, text=True, timeout=5).stdout)
            self.assertEqual(got, proxies["other"])

        # Closing the window keeps the app in the tray (the window itself
        # is destroyed); "Open speedtap" brings a new one.
        window = wait_until("the app's window", app_window)
        wait_until("the window shown", lambda: window_viewable(window))
        close_window(window)
        wait_until("the window closed", lambda: app_window() is None)
        time.sleep(0.5)
        self.assertIsNone(app.poll(), "closing the window must not quit the app")
        self.assertTrue(tray_label(item))
        click(item, "Open speedtap")
        window = wait_until("the app's window again", app_window)
        wait_until("the window shown again", lambda: window_viewable(window))

        # Quit exits 0.
        click(item, "Quit")
        self.assertEqual(app.wait(15), 0, self.work.log("app"))

    def test_the_tray_menu_keeps_its_calls_in_start_order_over_10_updates(self):
        """Three calls streaming at once stay in the order they started
        (the first at the top) through 10 updates of their menu lines, while
        their rates change from one second to the next."""
        # 5 tok/s for 100 tokens: each call streams for 20 s, long enough
        # for the three to be in the menu together over 10 updates (about
        # one a second, after some 4 s without a rate).
        slow = start_simulator(self.work, tps=5, tokens=100, ttft_ms=300)
        app, proxies, api_url, _ = start_app(self.work, {"slow": slow}, extra=["--hidden"])
        item = find_tray_item(app.pid)

        # A model name per call names its line (`zeta on slow · ...`); the
        # start order is not the names' alphabetical order. Each call starts
        # once the one before is in the engine, so the start order is sure.
        order = ["zeta", "alpha", "mu"]
        threads = []
        for model in order:
            threads += stream_in_background(proxies["slow"], model=model)
            wait_until(f"the {model} call in the engine", lambda: any(
                c.get("model") == model for c in api_get(api_url, "/api/v1/calls")["calls"]))
        calls = [c for c in api_get(api_url, "/api/v1/calls")["calls"] if c.get("model") in order]
        by_start = [c["model"] for c in sorted(calls, key=lambda c: c["started_at"])]
        self.assertEqual(by_start, order, f"the engine saw the calls start in order: {calls}")

        def call_lines(labels):
            return [l for l in labels if any(l.startswith(f"{m} on slow · ") for m in order)]

        labels = wait_until("three call lines in the menu",
                            lambda: (lambda ls: ls if len(call_lines(ls)) == 3 else None)(menu_labels(item)))
        seen = [labels]
        for update in range(1, 11):
            previous = labels
            labels = wait_until(f"the menu's update {update}",
                                lambda: (lambda ls: ls if ls != previous else None)(menu_labels(item)),
                                timeout=10)
            seen.append(labels)
            lines = call_lines(labels)
            self.assertEqual(len(lines), 3, f"update {update}: the three calls are still in flight: {labels}")
            # The calls come first in the menu, oldest at the top.
            self.assertEqual(labels[:3], lines, f"update {update}: calls first: {labels}")
            self.assertEqual([l.split(" on slow · ")[0] for l in lines], order,
                             f"update {update}: the calls in start order: {lines}")
        # The lines did update: more than one text per call over the reads.
        for i, model in enumerate(order):
            self.assertGreater(len({call_lines(ls)[i] for ls in seen}), 1, f"the {model} line updates")

        for t in threads:
            t.join(30)
        wait_until("no calls in flight", lambda: "No calls in flight" in menu_labels(item), timeout=15)

    def test_a_port_taken_at_start_keeps_the_app_up_and_its_menu_names_the_conflict(self):
        # Something else listens where the route wants to.
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        self.addCleanup(holder.close)
        port = holder.getsockname()[1]
        config = self.work.file("taken-config.toml", "")
        api = f"127.0.0.1:{free_port()}"
        ok_listen = f"127.0.0.1:{free_port()}"
        app = self.work.spawn("taken", [DESKTOP, "--hidden", "--config", config, "--api", api,
                                        "--route", f"busy=127.0.0.1:{port}={self.sim}",
                                        "--route", f"fine={ok_listen}={self.sim}"])
        item = find_tray_item(app.pid, timeout=30)
        self.assertIsNone(app.poll(), "the app stays up")

        labels = menu_labels(item)
        self.assertRegex(labels[0], rf"^Port {port} taken \(route busy\) by python3?[\w.]*, pid {os.getpid()}$")
        self.assertEqual(tray_label(item), f"port {port} taken")
        self.assertNotIn("Copy proxy URL (busy)", labels)
        self.assertIn("Copy proxy URL (fine)", labels)
        log = self.work.log("taken")
        self.assertIn(f"route busy did not start: cannot listen on 127.0.0.1:{port}", log)

        # The other route works as usual.
        self.assertIn("data:", stream_chat(f"http://{ok_listen}"))

    def test_a_server_started_after_the_app_is_listed_in_the_menu_and_measured(self):
        # No route configured: the app follows the machine. The server
        # starts after the app, under a model server's process name (a
        # link to the simulator), on a port no default list has.
        app, _, _, _ = start_app(self.work, {}, extra=["--hidden"], name="follow")
        item = find_tray_item(app.pid, timeout=30)
        link = os.path.join(self.work.path, "ollama")
        os.symlink(SPEEDTAP, link)
        port = free_port()
        server = self.work.spawn("ollama", [link, "simulate", "--listen", f"127.0.0.1:{port}",
                                            "--tps", "20", "--tokens", "60"])
        prefix = f"ollama-{port}: "
        line = wait_until("the server in the menu", lambda: next(
            (l for l in menu_labels(item) if l.startswith(prefix)), None), timeout=30)
        self.assertRegex(line, r"^ollama-\d+: (measured \(capture\)|through 127\.0\.0\.1:\d+)$")
        url = (f"http://{line.split('through ')[1]}" if "through" in line
               else f"http://127.0.0.1:{port}")
        threads = stream_in_background(url, count=1)
        wait_until("a tok/s label", lambda: label_rate(tray_label(item)))
        for t in threads:
            t.join(30)

        # Stopped: shown down under the same name.
        server.terminate()
        server.wait(10)
        wait_until("the server down in the menu", lambda: f"{prefix}down" in menu_labels(item), timeout=30)
        self.assertIn("found: Ollama", self.work.log("follow"))


if __name__ == "__main__":
    unittest.main()
