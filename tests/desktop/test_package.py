"""The Debian package, installed for real: `dpkg -i` of the package
scripts/package built (its path in SPEEDTAP_PACKAGE_DEB; scripts/test-desktop
builds a debug-profile one), the installed /usr/bin/speedtap-desktop starts
under Xvfb and shows its tray item over D-Bus, its "Open speedtap" starts
the installed /usr/bin/speedtap-window, the capture helper got its
capability, and `dpkg --purge` leaves none of the package's files behind.

Needs root (it installs system-wide); skipped without the package or root.
"""

import os
import shutil
import subprocess
import unittest

from desktop import (Workdir, app_window, click, find_tray_item, free_port, menu_labels, tray_label, wait_until,
                     window_processes)

DEB = os.environ.get("SPEEDTAP_PACKAGE_DEB", "")


def dpkg(*args):
    return subprocess.run(["dpkg", *args], capture_output=True, text=True, timeout=300)


@unittest.skipUnless(DEB and os.path.isfile(DEB), "no package (SPEEDTAP_PACKAGE_DEB); scripts/test-desktop builds one")
@unittest.skipUnless(hasattr(os, "geteuid") and os.geteuid() == 0, "installing a package needs root")
class PackageTest(unittest.TestCase):
    def setUp(self):
        self.name = subprocess.run(["dpkg-deb", "-f", DEB, "Package"], capture_output=True, text=True,
                                   check=True).stdout.strip()
        self.files = [l.split()[-1] for l in subprocess.run(
            ["dpkg-deb", "-c", DEB], capture_output=True, text=True, check=True).stdout.splitlines()
            if not l.startswith("d")]
        # `dpkg-deb -c` names them `usr/bin/x` or `./usr/bin/x`.
        self.files = ["/" + f.removeprefix("./").lstrip("/") for f in self.files]
        self.work = Workdir("package")
        self.addCleanup(self.work.close)
        self.addCleanup(lambda: dpkg("--purge", self.name))

    def test_the_package_installs_starts_in_the_tray_and_purges_cleanly(self):
        for f in ("/usr/bin/speedtap-desktop", "/usr/bin/speedtap-window", "/usr/bin/speedtap", "/usr/bin/speedtap-capture",
                  "/usr/share/applications/speedtap.desktop", "/etc/xdg/autostart/speedtap.desktop",
                  "/usr/lib/systemd/user/speedtap.service"):
            self.assertIn(f, self.files)
        self.assertTrue(any(f.startswith("/usr/share/icons/") for f in self.files), self.files)

        installed = dpkg("-i", DEB)
        self.assertEqual(installed.returncode, 0, installed.stdout + installed.stderr)
        if shutil.which("getcap"):
            caps = subprocess.run(["getcap", "/usr/bin/speedtap-capture"], capture_output=True, text=True).stdout
            self.assertIn("cap_net_raw", caps, "postinst gave the helper its capability")
        version = subprocess.run(["/usr/bin/speedtap", "--version"], capture_output=True, text=True, timeout=30)
        self.assertEqual(version.returncode, 0, version.stderr)

        config = self.work.file("config.toml", "")
        app = self.work.spawn("installed", [
            "/usr/bin/speedtap-desktop", "--hidden", "--config", config, "--api", f"127.0.0.1:{free_port()}",
            "--route", f"none=127.0.0.1:{free_port()}=http://127.0.0.1:9"])
        item = find_tray_item(app.pid, timeout=30)
        self.assertEqual(tray_label(item), "idle")
        self.assertIn("Open speedtap", menu_labels(item))
        # The window is the installed speedtap-window, started by the tray.
        click(item, "Open speedtap")
        wait_until("the installed app's window", app_window, timeout=60)
        [window] = wait_until("its window process", lambda: window_processes(app.pid))
        self.assertEqual(os.readlink(f"/proc/{window}/exe"), "/usr/bin/speedtap-window")
        app.terminate()
        self.assertEqual(app.wait(20), 0, self.work.log("installed"))

        purged = dpkg("--purge", self.name)
        self.assertEqual(purged.returncode, 0, purged.stdout + purged.stderr)
        left = [f for f in self.files if os.path.lexists(f) and not os.path.isdir(f)]
        self.assertEqual(left, [], "files left after purge")
        self.assertNotEqual(dpkg("-s", self.name).returncode, 0, "the package is gone")


if __name__ == "__main__":
    unittest.main()
