"""The artifact format's rules (`wakeful.domain.artifacts`), on an archive's members: what an
upload or an unpack refuses before a byte is stored or written."""

from __future__ import annotations

import pytest

from wakeful.domain.artifacts import (
    MAX_MEMBERS,
    ArtifactError,
    Member,
    check_bounds,
    check_upload,
)


def files(*names: str, size: int = 1) -> list[Member]:
    return [Member(name, True, size) for name in names]


@pytest.mark.parametrize(
    ("members", "max_bytes", "refusal"),
    [
        pytest.param(files("app.py", "lib/util.py"), 100, None, id="two small files pass"),
        pytest.param([], 100, None, id="an empty archive passes"),
        pytest.param(files("big.bin", size=100), 100, None, id="exactly at the bound passes"),
        pytest.param(
            files("zeros.bin", size=4 << 20),
            1 << 20,
            "unpacks to 4194304 bytes in 1 files",
            id="a compression bomb past the bound is refused",
        ),
        pytest.param(files("a", "b", size=60), 100, "unpacks to 120 bytes", id="the sizes add up"),
        pytest.param(
            [Member(f"f{i}", True, 0) for i in range(MAX_MEMBERS + 1)],
            100,
            f"the bounds are 100 bytes and {MAX_MEMBERS} files",
            id="one file more than MAX_MEMBERS is refused",
        ),
    ],
)
def test_bounds(members: list[Member], max_bytes: int, refusal: str | None) -> None:
    if refusal is None:
        check_bounds(members, max_bytes)
    else:
        with pytest.raises(ArtifactError, match=refusal):
            check_bounds(members, max_bytes)


@pytest.mark.parametrize(
    ("members", "refusal"),
    [
        pytest.param(files("run.sh", "static/app.css"), None, id="regular files pass"),
        pytest.param(
            [Member("static", False, 0)],
            "refusing artifact member 'static'",
            id="a directory entry is refused",
        ),
        pytest.param(
            [Member("link", False, 0)],
            "refusing artifact member 'link'",
            id="a link (or device, FIFO) is refused",
        ),
        pytest.param(
            files("/etc/passwd"),
            "refusing artifact member '/etc/passwd'",
            id="an absolute name is refused",
        ),
        pytest.param(
            files("ok.txt", "../out.txt"),
            r"refusing artifact member '\.\./out\.txt'",
            id="a name climbing out of the archive is refused",
        ),
        pytest.param(
            files("a/../../b"),
            "refusing artifact member",
            id="a climb in the middle of a name is refused",
        ),
        pytest.param(files("a..b/c..d"), None, id="dots inside a name are not a climb"),
        pytest.param(
            files("a.txt", "a.txt"),
            "'a.txt' is in the archive twice",
            id="a name given twice is refused",
        ),
        pytest.param(
            files("zeros.bin", size=3 << 30),
            "unpacks to 3221225472 bytes",
            id="past the default bound (2 GiB) is refused",
        ),
    ],
)
def test_what_an_upload_refuses(members: list[Member], refusal: str | None) -> None:
    if refusal is None:
        check_upload(members)
    else:
        with pytest.raises(ArtifactError, match=refusal):
            check_upload(members)
