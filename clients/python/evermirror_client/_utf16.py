"""Delta offsets count UTF-16 code units (what JavaScript's String.length counts); a
Python str counts code points. These convert between the two: a character beyond the
Basic Multilingual Plane (most emoji) is one code point but two UTF-16 units."""


def utf16_length(text: str) -> int:
    """The length of `text` in UTF-16 code units."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le")) // 2


def utf16_index(text: str, units: int) -> int:
    """The str index of the character at `units` UTF-16 code units into `text` (the
    end of `text` when it is shorter)."""
    if text.isascii():
        return min(max(units, 0), len(text))
    count = 0
    for index, char in enumerate(text):
        if count >= units:
            return index
        count += 2 if ord(char) > 0xFFFF else 1
    return len(text)
