"""Number words of German, English, French and Czech: what a spelled-out cardinal or ordinal
is worth ("zwei" 2, "einundzwanzig" 21, "dritten" 3, "twenty-one" 21, "quatre-vingt-dix" 90,
"dvacet" 20, "třetí" 3). ``number_matching.mentions`` joins a run of them ("deux cents" 200).
Other languages have no words here: their numbers count in digits only, and so do those of
an unknown language (""): a word is read as a number only in a language known to be the text's.
Read in all four at once, common words would count (English "set" as Czech 100, "elf" as German
11, Czech "ten", "that", as English 10): wrong numbers replaced, false credit given. A caller that can
name the language (the model's one target) passes it and the rest read digits only."""

from __future__ import annotations

import re
from typing import Iterable, Optional


def _table(text: str) -> dict[str, int]:
    """ "value:form form ..." entries separated by ";" -> {form: value}."""
    table = {}
    for entry in text.split(";"):
        value, forms = entry.split(":")
        table.update({form: int(value) for form in forms.split()})
    return table


DE_UNITS = _table("1:ein eins eine einen einem einer eines;2:zwei zwo zweier zweien;3:drei dreier dreien;4:vier vieren;"
                  "5:fünf fünfen;6:sechs;7:sieben;8:acht;9:neun")
DE_ARTICLES = frozenset({"ein", "eine", "einen", "einem", "einer", "eines"})
DE_TEENS = _table("10:zehn;11:elf;12:zwölf;13:dreizehn;14:vierzehn;15:fünfzehn;16:sechzehn;17:siebzehn;"
                  "18:achtzehn;19:neunzehn")
DE_TENS = _table("20:zwanzig;30:dreißig dreissig;40:vierzig;50:fünfzig;60:sechzig;70:siebzig;80:achtzig;90:neunzig")
DE_ORDINAL_STEMS = _table("1:erst;2:zweit;3:dritt;4:viert;5:fünft;6:sechst;7:siebt siebent;8:acht;9:neunt;"
                          "10:zehnt;11:elft;12:zwölft")
DE_ENDINGS = ("", "e", "er", "en", "em", "es")

EN_WORDS = _table("0:zero;1:one;2:two;3:three;4:four;5:five;6:six;7:seven;8:eight;9:nine;10:ten;11:eleven;"
                  "12:twelve dozen;13:thirteen;14:fourteen;15:fifteen;16:sixteen;17:seventeen;18:eighteen;"
                  "19:nineteen;20:twenty;30:thirty;40:forty;50:fifty;60:sixty;70:seventy;80:eighty;90:ninety;"
                  "100:hundred;1000:thousand;1000000:million")
EN_ORDINALS = _table("1:first;2:second;3:third;4:fourth;5:fifth;6:sixth;7:seventh;8:eighth;9:ninth;10:tenth;"
                     "11:eleventh;12:twelfth")

FR_WORDS = _table("0:zéro;1:un une;2:deux;3:trois;4:quatre;5:cinq;6:six;7:sept;8:huit;9:neuf;10:dix;11:onze;"
                  "12:douze;13:treize;14:quatorze;15:quinze;16:seize;20:vingt vingts;30:trente;40:quarante;"
                  "50:cinquante;60:soixante;80:quatre-vingt quatre-vingts;100:cent cents;1000:mille;"
                  "1000000:million millions")
FR_ARTICLES = frozenset({"un", "une"})
FR_ORDINALS = _table("1:premier première premiers premières;2:second seconde seconds secondes")

CS_WORDS = _table("0:nula;1:jeden jedna jedno jednoho jednomu jedné jednou jedním jedni jedny jedněch;"
                  "2:dva dvě dvou dvěma;3:tři tří třem třemi;4:čtyři čtyř čtyřem čtyřmi;100:sto sta set stě;"
                  "1000:tisíc tisíce tisíci")
CS_STEMS = _table("5:pět pěti;6:šest šesti;7:sedm sedmi;8:osm osmi;9:devět devíti;10:deset deseti desíti;"
                  "11:jedenáct;12:dvanáct;13:třináct;14:čtrnáct;15:patnáct;16:šestnáct;17:sedmnáct;18:osmnáct;"
                  "19:devatenáct;20:dvacet dvaceti;30:třicet třiceti;40:čtyřicet čtyřiceti;50:padesát;60:šedesát;"
                  "70:sedmdesát;80:osmdesát;90:devadesát")
CS_ORDINAL_STEMS = _table("2:druh;4:čtvrt;5:pát;6:šest;7:sedm;8:osm;9:devát;10:desát")
CS_ORDINALS = _table("1:první prvního prvnímu prvním prvních prvními;3:třetí třetího třetímu třetím třetích")
CS_ADJECTIVE = re.compile(r"(ý|á|é|ého|ému|ém|ým|ých|ými|ou)")
CONNECTORS = {"de": frozenset({"und"}), "en": frozenset({"and"}), "fr": frozenset({"et"}), "cs": frozenset({"a"})}


def combine(values: Iterable[int]) -> Optional[int]:
    """Number words read in a row: "zwei hundert" 200, "vingt et un" 21, "dvacet jedna" 21; None
    where they do not make one number: a word under a hundred after one no larger ("ein ein",
    "one two", "zwanzig dreißig") is a second number, not a sum."""
    total, current, last = 0, 0, None
    for value in values:
        if value == 100:
            current = max(current, 1) * 100
        elif value >= 1000:
            total += max(current, 1) * value
            current = 0
        else:
            if last is not None and last < 100 and value >= last:
                return None
            current += value
        last = value
    return total + current


def connector(word: str, lang: str) -> bool:
    """A word that may join number words ("vingt et un", "one hundred and five")."""
    return word.lower() in CONNECTORS.get(_base(lang), frozenset())


def has_number_words(lang: str) -> bool:
    """Whether xformer reads number words of ``lang`` (else digits alone count)."""
    return _base(lang) in CONNECTORS


def _base(lang: str) -> str:
    return lang.lower().replace("_", "-").split("-")[0]


def word_value(word: str, lang: str) -> Optional[tuple[int, bool]]:
    """(value, whether the word is also the indefinite article) of a number word of ``lang``, or
    None; a language without a table, or none ("": not known), has no number words."""
    lowered = word.lower()
    reader = READERS.get(_base(lang))
    value = reader(lowered) if reader is not None else None
    if value is None:
        return None
    return value, lowered in DE_ARTICLES if _base(lang) == "de" else lowered in FR_ARTICLES


def _german(word: str) -> Optional[int]:
    cardinal = _german_cardinal(word)
    if cardinal is not None:
        return cardinal
    for ending in DE_ENDINGS:  # ordinals: dritte, zwanzigsten, einundzwanzigstes
        if ending and not word.endswith(ending):
            continue
        stem = word[:len(word) - len(ending)]
        if stem in DE_ORDINAL_STEMS:
            return DE_ORDINAL_STEMS[stem]
        if stem.endswith("zehnt"):
            return _german_cardinal(stem[:-1])
        if stem.endswith("st") and len(stem) > 4:
            return _german_cardinal(stem[:-2])
    return None


def _german_cardinal(word: str) -> Optional[int]:
    """A German cardinal, compounds included ("zweitausendsieben", "neunzehnhundertneunzig")."""
    for table in (DE_UNITS, DE_TEENS, DE_TENS):
        if word in table:
            return table[word]
    for name, factor in (("tausend", 1000), ("hundert", 100)):
        head, found, tail = word.partition(name)
        if found:
            times = _german_cardinal(head) if head else 1
            rest = _german_cardinal(tail.removeprefix("und")) if tail else 0
            return None if times is None or rest is None else times * factor + rest
    unit, found, tens = word.partition("und")
    if found and unit in DE_UNITS and tens in DE_TENS:  # einundzwanzig
        return DE_UNITS[unit] + DE_TENS[tens]
    return None


def _hyphenated(word: str, table: dict[str, int]) -> Optional[int]:
    """Hyphen-joined number words, summed with their hundreds and thousands ("twenty-one",
    "dix-sept", "deux-cents", "vingt-et-un")."""
    parts = [part for part in word.split("-") if part not in ("et", "and")]
    if len(parts) < 2 or any(part not in table for part in parts):
        return None
    return combine(table[part] for part in parts)


def _english(word: str) -> Optional[int]:
    if word in EN_WORDS:
        return EN_WORDS[word]
    if word in EN_ORDINALS:
        return EN_ORDINALS[word]
    head, _, last = word.rpartition("-")
    if last in EN_ORDINALS or last.endswith("th"):  # twenty-first, thirteenth, twentieth, hundredth
        base = EN_ORDINALS.get(last)
        if base is None:
            stem = last[:-2]
            stem = stem[:-2] + "y" if stem.endswith("ie") else stem
            base = EN_WORDS.get(stem)
        if base is None:
            return None
        return base if not head else _hyphenated(f"{head}-{_english_cardinal_name(base)}", EN_WORDS)
    return _hyphenated(word, EN_WORDS)


def _english_cardinal_name(value: int) -> str:
    return next(word for word, v in EN_WORDS.items() if v == value)


def _french(word: str) -> Optional[int]:
    if word in FR_WORDS:
        return FR_WORDS[word]
    if word in FR_ORDINALS:
        return FR_ORDINALS[word]
    for ending in ("ièmes", "ième"):  # deuxième, cinquième, neuvième, vingt-et-unième
        if word.endswith(ending):
            stem = word[:-len(ending)]
            for candidate in (stem, stem + "e", stem.removesuffix("u"), stem.removesuffix("v") + "f"):
                value = _french(candidate) if candidate != word else None
                if value is not None:
                    return value
            return None
    normalized = word.replace("quatre-vingts", "quatre_vingt").replace("quatre-vingt", "quatre_vingt")
    table = {**FR_WORDS, "quatre_vingt": 80}
    return _hyphenated(normalized, table)


def _czech(word: str) -> Optional[int]:
    if word in CS_WORDS:
        return CS_WORDS[word]
    if word in CS_STEMS:
        return CS_STEMS[word]
    if word.endswith("i") and word[:-1] in CS_STEMS:  # jedenácti, padesáti
        return CS_STEMS[word[:-1]]
    if word in CS_ORDINALS:
        return CS_ORDINALS[word]
    for stem, value in CS_ORDINAL_STEMS.items():  # druhý, čtvrtého, pátá, desátých
        if word.startswith(stem) and CS_ADJECTIVE.fullmatch(word[len(stem):]):
            return value
    return None


READERS = {"de": _german, "en": _english, "fr": _french, "cs": _czech}
