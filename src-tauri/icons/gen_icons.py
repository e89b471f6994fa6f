#!/usr/bin/env python3
"""Draws speedtap's icons as RGBA PNGs with the standard library only.

    python3 src-tauri/icons/gen_icons.py      # rewrites the PNGs next to this file

The tray icon tells the state at a glance, for trays that draw no label:
colour *and* shape differ, so it reads without colour vision too.
- tray-idle.png       grey gauge, needle at rest (low left)
- tray-waiting.png    amber disc, three dots: waiting for a first token
- tray-streaming.png  green gauge, needle up high: tokens are flowing
- tray-slow.png       red disc, "!": a first token is later than the threshold
- tray-problem.png    grey gauge struck through in red: a port could not be had
- icon.png            the app icon (window, bundle): the streaming gauge, large

Shapes are signed-distance tests sampled 4x4 per pixel, so edges are
anti-aliased without any imaging library. The output is deterministic:
running the script again gives byte-identical files.
"""

import math
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SUB = 4  # samples per pixel per axis

GREY = (138, 143, 152)
AMBER = (232, 154, 20)
GREEN = (38, 166, 84)
RED = (214, 57, 48)
WHITE = (255, 255, 255)


def disc(cx, cy, r):
    return lambda x, y: math.hypot(x - cx, y - cy) <= r


def ring(cx, cy, r_in, r_out, start_deg, end_deg):
    """An arc band between two radii; angles in degrees, 0 = right, counter-clockwise."""

    def inside(x, y):
        d = math.hypot(x - cx, y - cy)
        if not r_in <= d <= r_out:
            return False
        a = math.degrees(math.atan2(cy - y, x - cx)) % 360
        lo, hi = start_deg % 360, end_deg % 360
        return lo <= a <= hi if lo <= hi else a >= lo or a <= hi

    return inside


def capsule(x0, y0, x1, y1, r):
    """A line segment with round ends."""

    def inside(x, y):
        dx, dy = x1 - x0, y1 - y0
        t = max(0.0, min(1.0, ((x - x0) * dx + (y - y0) * dy) / (dx * dx + dy * dy)))
        return math.hypot(x - (x0 + t * dx), y - (y0 + t * dy)) <= r

    return inside


def needle(cx, cy, length, width, angle_deg):
    a = math.radians(angle_deg)
    return capsule(cx, cy, cx + length * math.cos(a), cy - length * math.sin(a), width)


def render(size, layers):
    """layers: [(colour, [shape, ...])], later layers on top; shapes in unit coordinates."""
    rows = []
    for py in range(size):
        row = bytearray([0])  # PNG filter type 0 for this scanline
        for px in range(size):
            acc = [0.0, 0.0, 0.0, 0.0]  # premultiplied r, g, b and alpha coverage
            for sy in range(SUB):
                for sx in range(SUB):
                    x = (px + (sx + 0.5) / SUB) / size
                    y = (py + (sy + 0.5) / SUB) / size
                    colour = None
                    for c, shapes in layers:
                        if any(s(x, y) for s in shapes):
                            colour = c
                    if colour is not None:
                        for i in range(3):
                            acc[i] += colour[i]
                        acc[3] += 1
            n = SUB * SUB
            alpha = acc[3] / n
            if acc[3]:
                rgb = [round(acc[i] / acc[3]) for i in range(3)]
            else:
                rgb = [0, 0, 0]
            row += bytes(rgb + [round(alpha * 255)])
        rows.append(bytes(row))
    return png(size, size, b"".join(rows))


def png(w, h, raw):
    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


C = 0.5  # centre
BODY = 0.47  # disc radius


def gauge(colour, angle):
    return [
        (colour, [disc(C, C, BODY)]),
        (WHITE, [ring(C, C + 0.06, 0.27, 0.34, -30, 210)]),
        (WHITE, [needle(C, C + 0.06, 0.25, 0.055, angle), disc(C, C + 0.06, 0.085)]),
    ]


def waiting():
    return [
        (AMBER, [disc(C, C, BODY)]),
        (WHITE, [disc(0.27, C, 0.075), disc(C, C, 0.075), disc(0.73, C, 0.075)]),
    ]


def slow():
    return [
        (RED, [disc(C, C, BODY)]),
        (WHITE, [capsule(C, 0.22, C, 0.58, 0.075), disc(C, 0.77, 0.08)]),
    ]


def problem():
    return gauge(GREY, 200) + [(RED, [capsule(0.16, 0.16, 0.84, 0.84, 0.075)])]


ICONS = {
    "tray-idle.png": (32, gauge(GREY, 200)),
    "tray-waiting.png": (32, waiting()),
    "tray-streaming.png": (32, gauge(GREEN, 45)),
    "tray-slow.png": (32, slow()),
    "tray-problem.png": (32, problem()),
    "icon.png": (128, gauge(GREEN, 45)),
}


def main():
    for name, (size, layers) in ICONS.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(render(size, layers))
        print("wrote", name)


if __name__ == "__main__":
    main()
