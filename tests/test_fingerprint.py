"""fingerprint.py: what changed between two listings of a dataset's files, named (issue 19)."""


from dali_pipes.data import fingerprint
from dali_pipes.data.fingerprint import changes, of_files

PATHS = ["/d/a/1.jpg", "/d/a/2.jpg", "/d/b/3.jpg"]


def test_the_first_change_is_named():
    base = of_files(PATHS, [10, 20, 30])
    assert changes(base, of_files(PATHS, [10, 20, 30])) is None
    assert changes(base, of_files([p.replace("/d/", "/mnt/x/") for p in PATHS], [10, 20, 30])) is None  # moved
    assert changes(base, of_files(PATHS, [10, 21, 30])) == "file a/2.jpg changed (20 bytes then, 21 bytes now)"
    assert changes(base, of_files(PATHS[:2] + ["/d/b/4.jpg"], [10, 20, 30])) == \
        "file b/3.jpg was removed (3 files then, 3 now)"
    assert changes(base, of_files(PATHS + ["/d/b/4.jpg"], [10, 20, 30, 1])) == \
        "file b/4.jpg was added (3 files then, 4 now)"
    assert changes(base, of_files([PATHS[1], PATHS[0], PATHS[2]], [20, 10, 30])) == \
        "the order of the files changed (at position 0: a/1.jpg then, a/2.jpg now)"


def test_s3_versions_count():
    urls = ["s3://b/t/x-0.tar", "s3://b/t/x-1.tar"]
    base = of_files(urls, [5, 6], ['"e1"', '"e2"'])
    assert changes(base, of_files(urls, [5, 6], ['"e1"', '"e9"'])) == \
        'file x-1.tar changed (6 bytes, ETag "e2" then, 6 bytes, ETag "e9" now)'


def test_many_files_are_summed_up_per_folder(monkeypatch):
    monkeypatch.setattr(fingerprint, "ENTRY_LIMIT", 2)
    base = of_files(PATHS, [10, 20, 30])
    assert "entries" not in base and [g[:3] for g in base["groups"]] == [["a", 2, 30], ["b", 1, 30]]
    changed = changes(base, of_files(PATHS, [10, 20, 31]))
    assert changed.startswith("folder b changed (1 files, 30 bytes, digest ") and "1 files, 31 bytes" in changed
