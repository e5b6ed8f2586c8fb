"""What a store may point to: nothing outside itself. Opening a store walks its links first
and refuses external links, virtual datasets, external raw storage, soft and user-defined links,
and nesting deeper than :data:`MAX_GROUP_DEPTH`, without following any (docs/security.md).

Why a module apart from ``store.py``: it is the reader's security check, a walk of the HDF5
link graph that reads no table; kept alone it can be read and reviewed as one rule, and the
reader stays about reading. It runs once per file version and process (:data:`_CHECKED_FILES`:
the walk costs ~0.4 ms per rank of the store).
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
from rankscope.analysis.store.string_tables import Version, version_of
from rankscope.errors import InputFileError

#: Deepest group nesting a store may have (its own layout is 3 deep: /ranks/NNNNN/events).
MAX_GROUP_DEPTH = 8


def refuse_outside_references(path: Path, root: h5py.Group) -> None:
    """Refuse a store whose links or datasets point outside it, without following any.

    rankscope writes hard links and plain datasets only. External links, virtual datasets and
    datasets with external raw storage would make HDF5 read other files; soft links and
    user-defined links are refused as well (the layout has none), and so is nesting deeper
    than :data:`MAX_GROUP_DEPTH`.

    Why two walks: :func:`_suspect` asks HDF5's own C functions (each group's links listed with
    their kinds, each object's type, each dataset's layout) and only says whether anything is
    wrong: 0.09 s for the 4,639 objects of a 256-rank store, where the walk through h5py's
    objects (:func:`_refuse`) takes 0.24 s. Only a suspect store is walked again, by
    :func:`_refuse`, for the one line that names what is wrong.
    """
    if _suspect(root):
        _refuse(path, root)
        raise InputFileError(f"{path}: not a rankscope store (it points outside itself)")


def _suspect(root: h5py.Group) -> bool:
    """True when :func:`_refuse` may refuse the store: a link that is not a hard one, a
    dataset whose data lives outside (virtual, external raw storage), or groups nested deeper
    than :data:`MAX_GROUP_DEPTH`. Nothing is followed but hard links, and only that deep."""
    stack: list[tuple[h5py.h5g.GroupID, int]] = [(root.id, 0)]
    while stack:
        gid, depth = stack.pop()
        if depth > MAX_GROUP_DEPTH:
            return True
        for name, kind in _links(gid):
            if kind != h5py.h5l.TYPE_HARD:
                return True
            kind = h5py.h5o.get_info(gid, name).type
            if kind == h5py.h5o.TYPE_GROUP:
                stack.append((h5py.h5g.open(gid, name), depth + 1))
            elif kind == h5py.h5o.TYPE_DATASET:
                plist = h5py.h5d.open(gid, name).get_create_plist()
                if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count():
                    return True
    return False


def _links(gid: h5py.h5g.GroupID) -> list[tuple[bytes, int]]:
    """A group's links: (name, kind: ``h5l.TYPE_HARD``, ``TYPE_SOFT``, ...), none resolved."""
    links: list[tuple[bytes, int]] = []
    gid.links.iterate(lambda name, info: links.append((name, info.type)), info=True)
    return links


def _refuse(path: Path, root: h5py.Group) -> None:
    """The walk that names what is wrong (:func:`refuse_outside_references`), through h5py's
    objects; each link is read with ``getlink=True`` (nothing resolved)."""
    stack: list[tuple[h5py.Group, str, int]] = [(root, "", 0)]
    while stack:
        group, prefix, depth = stack.pop()
        if depth > MAX_GROUP_DEPTH:
            raise InputFileError(f"{path}: not a rankscope store (groups nested too deep)")
        for name in group:
            where = f"{prefix}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise InputFileError(
                    f"{path}: refused: {where} is an external link to "
                    f"{link.filename}:{link.path} (a store never points outside itself)"
                )
            if not isinstance(link, h5py.HardLink):
                raise InputFileError(
                    f"{path}: refused: {where} is a {type(link).__name__} "
                    "(a rankscope store holds hard links only)"
                )
            obj = group[name]
            if isinstance(obj, h5py.Group):
                stack.append((obj, where, depth + 1))
            elif isinstance(obj, h5py.Dataset):
                if obj.is_virtual:
                    raise InputFileError(
                        f"{path}: refused: {where} is a virtual dataset "
                        "(a store never points outside itself)"
                    )
                if obj.external:
                    raise InputFileError(
                        f"{path}: refused: {where} keeps its data in external file(s) "
                        f"{[str(e[0]) for e in obj.external]} (a store never points outside itself)"
                    )


#: Store files (device, inode, size, mtime) already walked by this process and found clean, or
#: written by it (:func:`written_here`): the analysis opens the store once per rank task, and
#: the walk costs ~0.4 ms per rank (0.09-0.12 s for a 256-rank store, 0.21-0.24 s through h5py's
#: objects before: :func:`refuse_outside_references`).
_CHECKED_FILES: set[Version] = set()


def written_here(path: Path) -> None:
    """``path`` is a store this process has just written (the merge's output, renamed into
    place): its writer makes hard links and plain datasets only, so this version of the file
    needs no walk (``rankscope analyze FOLDER`` analyses the store it merged). Another process
    that rewrites the file makes another version, which is walked."""
    try:
        st = os.stat(path)
    except OSError:
        return
    _CHECKED_FILES.add(version_of(st))


def refuse_outside_references_once(path: Path, root: h5py.Group) -> None:
    """:func:`refuse_outside_references`, skipped for a file version already found clean."""
    try:
        st = os.stat(path)
    except OSError:
        refuse_outside_references(path, root)
        return
    key = version_of(st)
    if key in _CHECKED_FILES:
        return
    refuse_outside_references(path, root)
    _CHECKED_FILES.add(key)
