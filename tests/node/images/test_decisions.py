"""The image cache's pure rules, as tables: which tar entries are refused, which trees make
room, what a rootlesscontainers record and an image's `User` mean."""

from __future__ import annotations

import tarfile

import pytest

from tests.support.images import Entry, device, directory, fifo, file, hardlink, opaque, symlink
from tests.support.images import whiteout as whiteout_of
from wakeful.node.images import ImageError
from wakeful.node.images.eviction import Held, to_evict
from wakeful.node.images.unpack import image_uid, rootless_ids
from wakeful.oci.scan import refusal


def named(kind: bytes, name: str, linkname: str = "") -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return Entry(info)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        pytest.param(file("etc/passwd"), None, id="a file inside"),
        pytest.param(file("./etc/passwd"), None, id="a ./ name"),
        pytest.param(directory("usr/lib"), None, id="a directory"),
        pytest.param(symlink("bin", "usr/bin"), None, id="a relative symlink"),
        pytest.param(symlink("lib/x", "/usr/lib/x"), None, id="an absolute symlink (Debian)"),
        pytest.param(symlink("a/b", "../../../../etc"), None, id="a symlink climbing out"),
        pytest.param(hardlink("b", "usr/bin/a"), None, id="a hard link inside"),
        pytest.param(whiteout_of("etc/old"), None, id="a whiteout of a file"),
        pytest.param(opaque("etc"), None, id="an opaque whiteout of a directory"),
        pytest.param(device("dev/null"), None, id="a device (made an empty file)"),
        pytest.param(fifo("run/fifo"), None, id="a FIFO (removed by the walk)"),
        pytest.param(file("../x"), 'entry "../x" leaves the root', id=".. first"),
        pytest.param(file("a/../../x"), 'entry "a/../../x" leaves the root', id=".. inside"),
        pytest.param(file("a/.."), 'entry "a/.." leaves the root', id=".. last"),
        pytest.param(file("/etc/x"), 'entry "/etc/x" is an absolute path', id="absolute"),
        pytest.param(
            named(tarfile.SYMTYPE, "../link", "x"),
            'entry "../link" leaves the root',
            id="a symlink whose own name climbs out",
        ),
        pytest.param(
            hardlink("p", "/etc/passwd"),
            'hard link "p" -> "/etc/passwd" points outside the root',
            id="a hard link to a host path",
        ),
        pytest.param(
            hardlink("p", "a/../../etc/passwd"),
            'hard link "p" -> "a/../../etc/passwd" points outside the root',
            id="a hard link climbing out",
        ),
        pytest.param(file("a/.wh..."), 'whiteout "a/.wh..." names ".."', id="a whiteout of .."),
        pytest.param(file(".wh.."), 'whiteout ".wh.." names "."', id="a whiteout of ."),
        pytest.param(
            opaque(""), 'opaque whiteout ".wh..wh..opq" would empty the root', id="opaque root"
        ),
        pytest.param(
            file("./.wh..wh..opq"),
            'opaque whiteout "./.wh..wh..opq" would empty the root',
            id="opaque root spelt ./",
        ),
    ],
)
def test_refusal(entry: Entry, reason: str | None) -> None:
    assert refusal(entry.info) == reason


def held(key: str, size: int, last_used: int, in_use: bool = False) -> Held:
    return Held(key, size, last_used, in_use)


@pytest.mark.parametrize(
    ("trees", "used", "need", "budget", "expected"),
    [
        pytest.param([held("a", 10, 1)], 10, 5, 100, [], id="room already: nothing goes"),
        pytest.param(
            [held("old", 40, 1), held("new", 40, 2)],
            80,
            30,
            100,
            ["old"],
            id="the least recently used goes first, and only as many as needed",
        ),
        pytest.param(
            [held("old", 40, 1, in_use=True), held("new", 40, 2)],
            80,
            30,
            100,
            ["new"],
            id="a held tree is never taken, however old",
        ),
        pytest.param(
            [held("a", 10, 3), held("b", 10, 1), held("c", 10, 2)],
            30,
            25,
            30,
            ["b", "c", "a"],
            id="all unused trees go when the need is that large",
        ),
        pytest.param(
            [held("a", 50, 1, in_use=True), held("b", 10, 2)],
            60,
            60,
            100,
            None,
            id="not enough even with every unused tree gone: none is taken",
        ),
    ],
)
def test_to_evict(
    trees: list[Held], used: int, need: int, budget: int, expected: list[str] | None
) -> None:
    assert to_evict(trees, used, need, budget) == expected


@pytest.mark.parametrize(
    ("record", "ids"),
    [
        pytest.param(b"\x08\xe8\x07\x10\xe9\x07", (1000, 1001), id="uid 1000, gid 1001"),
        pytest.param(b"\x08\x05\x10\xff\xff\xff\xff\x0f", (5, None), id="gid left root's"),
        pytest.param(b"\x10\x07", (None, 7), id="only a gid"),
        pytest.param(b"", (None, None), id="empty"),
        pytest.param(b"\x1a\x02hi\x08\x03", (3, None), id="an unknown field is skipped"),
    ],
)
def test_rootless_ids(record: bytes, ids: tuple[int | None, int | None]) -> None:
    assert rootless_ids(record) == ids


def test_a_truncated_rootless_record_is_an_error() -> None:
    with pytest.raises(ValueError, match="truncated"):
        rootless_ids(b"\x08\xe8")


PASSWD = "root:x:0:0::/root:/bin/sh\nwww:x:33:33::/var/www:/bin/sh\n"


@pytest.mark.parametrize(
    ("user", "passwd", "uid"),
    [
        pytest.param("", None, 0, id="no User: root"),
        pytest.param("root", PASSWD, 0, id="root by name"),
        pytest.param("0:0", None, 0, id="0:0"),
        pytest.param("1000", None, 1000, id="a uid"),
        pytest.param("1000:100", None, 1000, id="uid:gid"),
        pytest.param("www", PASSWD, 33, id="a name in /etc/passwd"),
        pytest.param("www:www", PASSWD, 33, id="name:group"),
    ],
)
def test_image_uid(user: str, passwd: str | None, uid: int) -> None:
    assert image_uid(user, passwd) == uid


def test_an_unknown_user_name_is_an_error_that_says_so() -> None:
    with pytest.raises(ImageError, match='runs as user "nginx", who is not in its /etc/passwd'):
        image_uid("nginx", PASSWD)
