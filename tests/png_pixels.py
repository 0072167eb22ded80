"""A PNG reader in the standard library (zlib), enough for Chromium's screenshots: 8-bit RGB or RGBA,
not interlaced. The report test counts pixels of given colours with it."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    bpp: int
    rows: tuple[bytes, ...]

    def rgb(self, x: int, y: int) -> tuple[int, int, int]:
        i = x * self.bpp
        row = self.rows[y]
        return row[i], row[i + 1], row[i + 2]


def _chunks(data: bytes):
    pos = len(SIGNATURE)
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        yield kind, data[pos + 8:pos + 8 + length]
        pos += 12 + length


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> bytearray:
    if kind == 1:
        for i in range(bpp, len(line)):
            line[i] = (line[i] + line[i - bpp]) & 255
    elif kind == 2:
        line = bytearray((a + b) & 255 for a, b in zip(line, prev))
    elif kind == 3:
        for i in range(len(line)):
            line[i] = (line[i] + (((line[i - bpp] if i >= bpp else 0) + prev[i]) >> 1)) & 255
    elif kind == 4:
        for i in range(len(line)):
            left = i >= bpp
            line[i] = (line[i] + _paeth(line[i - bpp] if left else 0, prev[i], prev[i - bpp] if left else 0)) & 255
    elif kind != 0:
        raise ValueError(f"PNG: unknown filter {kind}")
    return line


def read_png(data: bytes) -> Image:
    """Decode `data`; raises ValueError for anything but 8-bit RGB/RGBA without interlacing."""
    if not data.startswith(SIGNATURE):
        raise ValueError("not a PNG")
    header, idat = None, []
    for kind, body in _chunks(data):
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"PNG kind not handled: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        prev = _unfilter(raw[start], bytearray(raw[start + 1:start + 1 + stride]), prev, bpp)
        rows.append(bytes(prev))
    return Image(width, height, bpp, tuple(rows))


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def count_near(image: Image, colour: str, background: str, reach: int = 3) -> int:
    """Pixels of exactly `colour` with a pixel of `background` within `reach` pixels left, right, up or
    down: a line drawn inside a plot area counts, a legend swatch on the page's white does not."""
    want, around = bytes(hex_rgb(colour)), bytes(hex_rgb(background))
    bpp, found = image.bpp, 0
    for y, row in enumerate(image.rows):
        start = row.find(want)
        while start != -1:
            if start % bpp == 0:
                x = start // bpp
                if _near(image, x, y, around, reach):
                    found += 1
            start = row.find(want, start + 1)
    return found


def _near(image: Image, x: int, y: int, around: bytes, reach: int) -> bool:
    bpp = image.bpp
    for d in range(1, reach + 1):
        for nx, ny in ((x - d, y), (x + d, y), (x, y - d), (x, y + d)):
            if 0 <= nx < image.width and 0 <= ny < image.height:
                row = image.rows[ny]
                if row[nx * bpp:nx * bpp + 3] == around:
                    return True
    return False
