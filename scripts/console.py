"""A console filter for horovodrun's merged output (``horovodrun ... 2>&1 | python scripts/console.py``).

- Drops TensorFlow's C++ start-up notices, which ignore TF_CPP_MIN_LOG_LEVEL (TensorFlow 2.19+
  logs them through absl before absl::InitializeLog): the absl banner, and the INFO lines
  "Could not find cuda drivers" (cudart_stub.cc) and "oneDNN custom operations are on"
  (port.cc). horovodrun prints them because its Gloo/MPI build check imports
  horovod.tensorflow in a subprocess; TensorFlow ranks print them too. Every other line,
  warnings and errors at any level included, passes through.
- Strips horovodrun's ``[0]<stdout>:`` / ``[0]<stderr>:`` prefix from rank 0, the rank that
  reports, so its progress bar redraws in place; other ranks keep their prefix.

Lines end at a newline or a carriage return (a progress-bar redraw) and pass on as they end.
"""

from __future__ import annotations

import os
import re
import sys

PREFIX = re.compile(rb"^\[(\d+)\]<std(?:out|err)>:")
NOISE = (
    re.compile(rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    re.compile(rb"^I\d{4} [\d:. ]+\d+ (?:cudart_stub|port)\.cc:\d+\] "),
)
LINE_END = re.compile(rb"[\r\n]")


def clean(segment: bytes) -> bytes:
    """One line with its terminator → what to show (b"" to drop it)."""
    match = PREFIX.match(segment)
    body = segment[match.end():] if match else segment
    if any(n.match(body.rstrip(b"\r\n")) for n in NOISE):
        return b""
    return body if match is None or match.group(1) == b"0" else segment


def main() -> None:
    pending = b""
    out = sys.stdout.buffer
    while chunk := os.read(sys.stdin.fileno(), 65536):
        pending += chunk
        start = 0
        for end in LINE_END.finditer(pending):
            out.write(clean(pending[start:end.end()]))
            start = end.end()
        pending = pending[start:]
        out.flush()
    out.write(clean(pending))
    out.flush()


if __name__ == "__main__":
    main()
