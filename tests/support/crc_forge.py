"""A dataset index segment that cuts a shard at other boundaries yet keeps its CRC-32C: the
forgery a non-cryptographic key of a shard's entries would let pass as the entries another
process checked (CRC-32C is linear: the change is solved for over GF(2))."""

from __future__ import annotations

from streamrec.format.crc import crc32c


def same_crc_lengths(lengths: list[int], width: int, target: int, free: range) -> list[int]:
    """``lengths`` (a segment's entries, ``width`` bytes each) changed only in entries of
    ``free``, keeping their sum, so that the segment's CRC-32C is ``target``. Each change is
    +1/-1 on an even/odd pair (bit 0 of both flips), plus one +2/-1/-1 triple (CRC-32C's
    even-weight changes span only 31 bits: one odd-weight change completes the basis)."""

    def encode(values: list[int]) -> bytes:
        return b"".join(int(n).to_bytes(width, "little") for n in values)

    size = len(lengths) * width
    zero = crc32c(bytes(size))

    def delta(flips: list[tuple[int, int]]) -> int:
        mask = bytearray(size)
        for entry, bit in flips:
            mask[entry * width] ^= bit
        return crc32c(bytes(mask)) ^ zero

    entries = list(free)
    evens = [i for i in entries[: len(entries) * 3 // 4] if lengths[i] % 2 == 0]
    odds = [i for i in entries[: len(entries) * 3 // 4] if lengths[i] % 2 == 1]
    moves: list[tuple[tuple[int, ...], int]] = [
        ((up, down), delta([(up, 1), (down, 1)])) for up, down in zip(evens, odds, strict=False)
    ]
    tail = entries[len(entries) * 3 // 4 :]
    twos = [i for i in tail if not lengths[i] & 2]
    ones = [i for i in tail if lengths[i] & 1 and i not in twos]
    triple = (twos[0], ones[0], ones[1])
    moves.append((triple, delta([(triple[0], 2), (triple[1], 1), (triple[2], 1)])))
    basis: dict[int, tuple[int, set[tuple[int, ...]]]] = {}
    for move, vector in moves:
        chosen = {move}
        for bit in sorted(basis, reverse=True):
            if vector >> bit & 1:
                vector ^= basis[bit][0]
                chosen ^= basis[bit][1]
        if vector:
            basis[vector.bit_length() - 1] = (vector, chosen)
    want, picked = crc32c(encode(lengths)) ^ target, set()
    for bit in sorted(basis, reverse=True):
        if want >> bit & 1:
            want ^= basis[bit][0]
            picked ^= basis[bit][1]
    assert want == 0, "not enough free entries to reach the CRC"
    forged = list(lengths)
    for move in picked:
        if len(move) == 3:
            forged[move[0]] += 2
            forged[move[1]] -= 1
            forged[move[2]] -= 1
        else:
            forged[move[0]] += 1
            forged[move[1]] -= 1
    assert crc32c(encode(forged)) == target and sum(forged) == sum(lengths)
    return forged
