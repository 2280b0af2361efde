"""Enough of a PNG decoder to tell a real screenshot from a blank one (no Pillow needed):
8-bit greyscale/RGB/RGBA, not interlaced, which is what Chromium's screenshots are."""

from __future__ import annotations

import statistics
import struct
import zlib
from itertools import accumulate

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> samples per pixel


def _add_mod_256(total: int, value: int) -> int:
    return (total + value) & 255


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind: int, raw: bytes, prev: bytes, bpp: int) -> bytes:
    if kind == 0:
        return raw
    if kind == 2:
        return bytes((x + b) & 255 for x, b in zip(raw, prev, strict=True))
    if kind == 1:  # each channel is a running sum of its own bytes
        out = bytearray(len(raw))
        for channel in range(bpp):
            out[channel::bpp] = bytes(accumulate(list(raw[channel::bpp]), _add_mod_256))
        return bytes(out)
    out = bytearray(raw)
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        c = prev[i - bpp] if i >= bpp else 0
        if kind == 3:
            out[i] = (out[i] + ((a + prev[i]) >> 1)) & 255
        else:
            out[i] = (out[i] + _paeth(a, prev[i], c)) & 255
    return bytes(out)


def decode_rows(png: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, samples per pixel, rows of raw samples)."""
    assert png.startswith(_SIGNATURE), "not a PNG"
    pos, idat, header = len(_SIGNATURE), bytearray(), b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = data
        elif kind == b"IDAT":
            idat += data
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in _CHANNELS and interlace == 0, (depth, colour, interlace)
    bpp = _CHANNELS[colour]
    stride = width * bpp
    data = zlib.decompress(bytes(idat))
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        prev = _unfilter(data[start], data[start + 1 : start + 1 + stride], prev, bpp)
        rows.append(prev)
    return width, height, bpp, rows


def summary(png: bytes) -> tuple[int, int, int, float]:
    """(width, height, distinct colours, standard deviation of the brightness)."""
    width, height, bpp, rows = decode_rows(png)
    colours: set[bytes] = set()
    brightness: list[int] = []
    for row in rows[::2]:  # every other row and pixel: plenty for a yes/no on blankness
        for x in range(0, width * bpp, 2 * bpp):
            pixel = row[x : x + min(bpp, 3)]
            colours.add(pixel)
            brightness.append(sum(pixel))
    return width, height, len(colours), statistics.pstdev(brightness)
