"""Built-in synthetic document pages: the offline default data set of DocVQA-CLI-v0.

Why synthetic: real DocVQA pages cannot ship with the package, yet the environment needs a
set that works offline and is reproducible.  Pages (invoices, receipts, forms, letters,
tables) are drawn with Pillow at about 200 dpi, then degraded like a scan.  Every question's
answer is text copied from the page, and a question is kept only if tesseract can actually
read a gold answer back (best sliding-window ANLS >= 0.5) -- that score is stored as the
task's difficulty.  Page ``i`` depends only on ``(seed, i)``, so output is byte-identical
for the same seed however the work is split across processes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from agent_envs.core.cache import MARKER, build_once, is_complete
from agent_envs.core.workers import FreshPool
from agent_envs.envs.docvqa.task import DocTask
from agent_envs.envs.docvqa.scoring import anls, normalize

VERSION = "synth-docs-1"
SOURCE = "agent-envs/synthetic-docs"
PAGE_SIZE = (1700, 2200)  # US Letter at 200 dpi
DPI = 200
QUESTIONS_PER_PAGE = 8
MIN_OCR_ANLS = 0.5
#: worker processes of a build: one a core, 2 to 8 (the questions and pages kept do not depend on it)
WORKERS = min(8, max(2, len(os.sched_getaffinity(0))))
FONT_DIRS = (
    Path("/usr/share/fonts/truetype/dejavu"),
    Path("/usr/share/fonts/truetype/liberation"),
)
FONT_FAMILIES = (
    ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf"),
    ("DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf"),
    ("LiberationSans-Regular.ttf", "LiberationSans-Bold.ttf"),
    ("LiberationSerif-Regular.ttf", "LiberationSerif-Bold.ttf"),
    ("DejaVuSansCondensed.ttf", "DejaVuSansCondensed-Bold.ttf"),
)
MONO_FAMILY = ("LiberationMono-Regular.ttf", "LiberationMono-Bold.ttf")

# fmt: off
FIRST = ('James', 'Mary', 'Robert', 'Linda', 'Michael', 'Susan', 'David', 'Karen', 'Richard',
         'Nancy', 'Thomas', 'Helen', 'Charles', 'Carol', 'Daniel', 'Ruth', 'Paul', 'Sharon',
         'Mark', 'Donna', 'George', 'Janet', 'Kenneth', 'Alice', 'Edward', 'Joan')
LAST = ('Anderson', 'Bennett', 'Carter', 'Dawson', 'Ellis', 'Fletcher', 'Garrison', 'Hughes',
        'Ingram', 'Jensen', 'Keller', 'Lambert', 'Morrison', 'Nolan', 'Osborne', 'Parker',
        'Reynolds', 'Sutton', 'Turner', 'Underwood', 'Vaughn', 'Whitaker', 'Holloway', 'Prescott',
        'Whitfield', 'Zimmerman')
COMPANY_A = ('Northern', 'Atlantic', 'Summit', 'Pioneer', 'Liberty', 'Cedar', 'Granite', 'Harbor',
             'Midwest', 'Keystone', 'Sterling')
COMPANY_B = ('Supply', 'Laboratories', 'Industries', 'Research', 'Products', 'Services',
             'Chemical', 'Printing', 'Instruments')
COMPANY_C = ('Inc.', 'Co.', 'Corporation', 'Company', 'Ltd.')
STREETS = ('Maple', 'Oak', 'Elm', 'Washington', 'Lincoln', 'Park', 'Lake', 'Hill', 'Main',
           'Church', 'Market', 'Spring')
STREET_KINDS = ('Street', 'Avenue', 'Road', 'Boulevard', 'Drive')
CITIES = (('Richmond', 'VA'), ('Louisville', 'KY'), ('Raleigh', 'NC'), ('Atlanta', 'GA'),
          ('Chicago', 'IL'), ('Denver', 'CO'), ('Boston', 'MA'), ('Nashville', 'TN'),
          ('Baltimore', 'MD'), ('Columbus', 'OH'), ('Portland', 'OR'), ('Austin', 'TX'))
MONTHS = ('January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September',
          'October', 'November', 'December')
INVOICE_ITEMS = ('Laboratory glassware', 'Filter paper', 'Printer cartridges',
                 'Sample containers', 'Office chairs', 'Binding covers', 'Calibration service',
                 'Storage cabinet', 'Microscope slides', 'Safety goggles', 'Copy paper',
                 'Desk lamps', 'Thermometers')
RECEIPT_ITEMS = ('Coffee', 'Bagel', 'Orange Juice', 'Sandwich', 'Muffin', 'Tea', 'Salad', 'Soup',
                 'Cookies', 'Milk', 'Bread', 'Apples', 'Eggs', 'Butter', 'Cheese')
EXPENSE_ROWS = ('Salaries', 'Fringe Benefits', 'Travel', 'Publications', 'Supplies', 'Equipment',
                'Postage', 'Telephone', 'Consultants', 'Rent', 'Printing', 'Computer Services')
POSITIONS = ('Research Chemist', 'Accountant', 'Sales Representative', 'Lab Technician',
             'Office Manager', 'Field Supervisor', 'Statistician', 'Engineer')
RELATIONS = ('Spouse', 'Brother', 'Sister', 'Parent', 'Friend', 'Neighbor')
# fmt: on


@dataclass
class Question:
    text: str
    answers: list[str]


@dataclass
class Page:
    """A drawn (clean) page plus the questions its text supports."""

    kind: str
    image: Image.Image
    questions: list[Question] = field(default_factory=list)


# ---------------------------------------------------------------- fonts and drawing


@lru_cache(maxsize=256)
def _font(name: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for directory in FONT_DIRS:
        if (directory / name).is_file():
            return ImageFont.truetype(str(directory / name), size)
    warnings.warn(
        f"font {name} not found under {', '.join(map(str, FONT_DIRS))}; using Pillow's default "
        "font (install fonts-dejavu-core, fonts-dejavu-extra and fonts-liberation for the reference look)",
        stacklevel=2,
    )
    return ImageFont.load_default(size=size)


class _Canvas:
    """Thin wrapper over ImageDraw with one font family and a vertical cursor."""

    def __init__(self, family: tuple[str, str]) -> None:
        self.image = Image.new("L", PAGE_SIZE, 255)
        self.draw = ImageDraw.Draw(self.image)
        self.family = family

    def text(
        self,
        x: int,
        y: int,
        s: str,
        size: int,
        *,
        bold: bool = False,
        anchor: str = "la",
        fill: int = 0,
    ) -> None:
        font = _font(self.family[1] if bold else self.family[0], size)
        self.draw.text((x, y), s, font=font, fill=fill, anchor=anchor)

    def width(self, s: str, size: int) -> float:
        return self.draw.textlength(s, font=_font(self.family[0], size))

    def rule(self, y: int, x0: int = 150, x1: int = 1550, width: int = 3) -> None:
        self.draw.line((x0, y, x1, y), fill=0, width=width)

    def paragraph(self, x: int, y: int, s: str, size: int, max_width: int) -> int:
        """Word-wrap ``s``; return the y below the last line."""
        line = ""
        for word in s.split():
            trial = f"{line} {word}".strip()
            if line and self.width(trial, size) > max_width:
                self.text(x, y, line, size)
                y, line = y + int(size * 1.5), word
            else:
                line = trial
        self.text(x, y, line, size)
        return y + int(size * 1.5)


# ---------------------------------------------------------------- random content


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _company(rng: random.Random) -> str:
    return f"{rng.choice(COMPANY_A)} {rng.choice(COMPANY_B)} {rng.choice(COMPANY_C)}"


def _street(rng: random.Random) -> str:
    return f"{rng.randint(12, 9899)} {rng.choice(STREETS)} {rng.choice(STREET_KINDS)}"


def _city(rng: random.Random) -> str:
    city, state = rng.choice(CITIES)
    return f"{city}, {state} {rng.randint(10000, 99999)}"


def _phone(rng: random.Random) -> str:
    return f"({rng.randint(201, 989)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"


def _date(rng: random.Random, year: int | None = None) -> str:
    year = year or rng.randint(1972, 1999)
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {year}"


def _money(cents: int) -> tuple[str, list[str]]:
    """``$975.00`` and its DocVQA-style accepted variants."""
    plain = f"{cents // 100:,}.{cents % 100:02d}"
    return f"${plain}", [f"${plain}", plain]


def _dollars(amount: int) -> tuple[str, list[str]]:
    return f"${amount:,}", [f"${amount:,}", f"{amount:,}"]


# ---------------------------------------------------------------- page layouts


def _invoice(rng: random.Random, family: tuple[str, str]) -> Page:
    c = _Canvas(family)
    seller, number = _company(rng), f"INV-{rng.randint(10000, 99999)}"
    year = rng.randint(1975, 1999)
    issued, due = _date(rng, year), _date(rng, year)
    c.text(150, 150, seller, 60, bold=True)
    c.text(150, 235, _street(rng), 32)
    c.text(150, 280, _city(rng), 32)
    c.text(1550, 150, "INVOICE", 72, bold=True, anchor="ra")
    for k, (label, value) in enumerate((("Invoice No:", number), ("Invoice Date:", issued), ("Due Date:", due))):
        c.text(1000, 380 + 50 * k, label, 32, bold=True)
        c.text(1260, 380 + 50 * k, value, 32)
    parties = {}
    for x, title in ((150, "BILL TO"), (900, "SHIP TO")):
        person, phone = _name(rng), _phone(rng)
        parties[title] = (person, phone)
        c.text(x, 600, title, 36, bold=True)
        for k, line in enumerate((person, _company(rng), _street(rng), _city(rng))):
            c.text(x, 660 + 45 * k, line, 32)
        c.text(x, 660 + 45 * 4, f"Phone: {phone}", 32)
    y = 980
    c.rule(y - 15)
    for x, head, anchor in (
        (150, "Description", "la"),
        (1000, "Qty", "ra"),
        (1270, "Unit Price", "ra"),
        (1550, "Amount", "ra"),
    ):
        c.text(x, y, head, 34, bold=True, anchor=anchor)
    c.rule(y + 55)
    items, subtotal = [], 0
    for k, item in enumerate(rng.sample(INVOICE_ITEMS, rng.randint(3, 6))):
        qty, unit = rng.randint(1, 40), rng.randint(150, 45000)
        amount = qty * unit
        subtotal += amount
        row_y = y + 80 + 60 * k
        c.text(150, row_y, item, 32)
        c.text(1000, row_y, str(qty), 32, anchor="ra")
        c.text(1270, row_y, _money(unit)[0], 32, anchor="ra")
        c.text(1550, row_y, _money(amount)[0], 32, anchor="ra")
        items.append((item, qty, amount))
    rate = rng.choice((4, 5, 6, 7, 8))
    tax, shipping = subtotal * rate // 100, rng.randint(500, 9000)
    total = subtotal + tax + shipping
    y = y + 80 + 60 * len(items) + 40
    c.rule(y - 20, x0=950)
    for k, (label, cents) in enumerate(
        (
            ("Subtotal", subtotal),
            (f"Tax ({rate}%)", tax),
            ("Shipping", shipping),
            ("Total Due", total),
        )
    ):
        c.text(1000, y + 55 * k, label, 34, bold=label == "Total Due")
        c.text(
            1550,
            y + 55 * k,
            _money(cents)[0],
            34,
            bold=label == "Total Due",
            anchor="ra",
        )
    account = f"{rng.randint(1000, 9999)}-{rng.randint(1000, 9999)}"
    c.text(150, 2000, "Payment terms: Net 30 days. Thank you for your business.", 28)
    c.text(150, 2045, f"Please quote account no. {account} with your remittance.", 20)
    item, qty, amount = rng.choice(items)
    return Page(
        "invoice",
        c.image,
        [
            Question("What is the invoice number?", [number]),
            Question("What is the invoice date?", [issued]),
            Question("What is the due date of the invoice?", [due]),
            Question(
                "What is the phone number in the Bill To section?",
                [parties["BILL TO"][1]],
            ),
            Question(
                "What is the phone number in the Ship To section?",
                [parties["SHIP TO"][1]],
            ),
            Question("To whom is the invoice billed?", [parties["BILL TO"][0]]),
            Question("What is the subtotal?", _money(subtotal)[1]),
            Question("What is the total amount due?", _money(total)[1]),
            Question("What is the tax amount?", _money(tax)[1]),
            Question(f"What is the amount for {item}?", _money(amount)[1]),
            Question(f"What quantity of {item} was ordered?", [str(qty)]),
            Question("Which company issued the invoice?", [seller]),
            Question("What account number should be quoted with the remittance?", [account]),
        ],
    )


def _receipt(rng: random.Random, family: tuple[str, str]) -> Page:
    c = _Canvas(MONO_FAMILY)
    store, phone = f"{rng.choice(COMPANY_A).upper()} MARKET", _phone(rng)
    date = f"{rng.randint(1, 12):02d}/{rng.randint(1, 28):02d}/{rng.randint(1980, 1999)}"
    clock, number = (
        f"{rng.randint(7, 21):02d}:{rng.randint(0, 59):02d}",
        str(rng.randint(100000, 999999)),
    )
    c.text(850, 250, store, 56, bold=True, anchor="ma")
    c.text(850, 330, _street(rng), 34, anchor="ma")
    c.text(850, 380, f"Tel {phone}", 34, anchor="ma")
    c.text(450, 480, f"Date: {date}", 36)
    c.text(1250, 480, f"Time: {clock}", 36, anchor="ra")
    c.text(450, 535, f"Receipt #: {number}", 36)
    c.rule(605, 450, 1250, 2)
    prices, subtotal = {}, 0
    for k, item in enumerate(rng.sample(RECEIPT_ITEMS, rng.randint(4, 8))):
        cents = rng.randint(99, 1899)
        prices[item], subtotal = cents, subtotal + cents
        c.text(450, 640 + 55 * k, item.upper(), 36)
        c.text(1250, 640 + 55 * k, _money(cents)[0], 36, anchor="ra")
    tax = subtotal * 6 // 100
    total = subtotal + tax
    tendered = (total // 500 + 1) * 500
    y = 640 + 55 * len(prices) + 30
    c.rule(y - 10, 450, 1250, 2)
    for k, (label, cents) in enumerate(
        (
            ("SUBTOTAL", subtotal),
            ("TAX", tax),
            ("TOTAL", total),
            ("CASH", tendered),
            ("CHANGE", tendered - total),
        )
    ):
        c.text(450, y + 20 + 55 * k, label, 36, bold=label == "TOTAL")
        c.text(
            1250,
            y + 20 + 55 * k,
            _money(cents)[0],
            36,
            bold=label == "TOTAL",
            anchor="ra",
        )
    cashier = rng.choice(FIRST).upper()
    c.text(850, y + 400, "THANK YOU FOR SHOPPING WITH US", 32, anchor="ma")
    c.text(
        850,
        y + 450,
        f"CASHIER: {cashier}   REGISTER {rng.randint(1, 12):02d}",
        22,
        anchor="ma",
    )
    item = rng.choice(list(prices))
    return Page(
        "receipt",
        c.image,
        [
            Question("What is the name of the store?", [store]),
            Question("What is the date on the receipt?", [date]),
            Question("At what time was the purchase made?", [clock]),
            Question("What is the receipt number?", [number]),
            Question(f"How much did the {item.lower()} cost?", _money(prices[item])[1]),
            Question("What is the subtotal?", _money(subtotal)[1]),
            Question("What is the total?", _money(total)[1]),
            Question("How much tax was charged?", _money(tax)[1]),
            Question("How much change was given?", _money(tendered - total)[1]),
            Question("What is the store's telephone number?", [phone]),
            Question("Who was the cashier?", [cashier]),
        ],
    )


def _form(rng: random.Random, family: tuple[str, str]) -> Page:
    c = _Canvas(family)
    applicant, contact = _name(rng), _name(rng)
    birth = f"{rng.randint(1, 12):02d}/{rng.randint(1, 28):02d}/{rng.randint(1930, 1965)}"
    phone_a, phone_c = _phone(rng), _phone(rng)
    employer, position = _company(rng), rng.choice(POSITIONS)
    start, salary = _date(rng), rng.randint(18, 95) * 1000
    relation = rng.choice(RELATIONS)
    c.text(850, 150, "EMPLOYEE INFORMATION FORM", 56, bold=True, anchor="ma")
    form_no = f"{rng.randint(100, 999)}-{rng.choice('ABCDEFG')}"
    c.text(850, 230, f"Form No. {form_no}", 22, anchor="ma")
    sections = (
        (
            "SECTION A. APPLICANT",
            (
                ("Name", applicant),
                ("Date of Birth", birth),
                ("Telephone", phone_a),
                ("Address", _street(rng)),
            ),
        ),
        (
            "SECTION B. EMERGENCY CONTACT",
            (("Name", contact), ("Relationship", relation), ("Telephone", phone_c)),
        ),
        (
            "SECTION C. EMPLOYMENT",
            (
                ("Employer", employer),
                ("Position", position),
                ("Start Date", start),
                ("Annual Salary", _dollars(salary)[0]),
            ),
        ),
    )
    y = 340
    for title, fields in sections:
        c.draw.rectangle((150, y, 1550, y + 60), fill=215)
        c.text(170, y + 12, title, 34, bold=True)
        y += 100
        for label, value in fields:
            c.text(170, y, f"{label}:", 34)
            c.text(600, y, value, 34)
            c.rule(y + 46, 590, 1550, 2)
            y += 75
        y += 40
    c.text(170, y + 60, "Signature: ______________________", 32)
    return Page(
        "form",
        c.image,
        [
            Question("What is the name of the applicant?", [applicant]),
            Question("What is the applicant's date of birth?", [birth]),
            Question("What is the applicant's telephone number?", [phone_a]),
            Question("What is the telephone number of the emergency contact?", [phone_c]),
            Question("Who is the emergency contact?", [contact]),
            Question("What is the relationship of the emergency contact?", [relation]),
            Question("Who is the employer?", [employer]),
            Question("What is the position?", [position]),
            Question("What is the start date?", [start]),
            Question("What is the annual salary?", _dollars(salary)[1]),
            Question("What is the form number?", [form_no]),
        ],
    )


def _letter(rng: random.Random, family: tuple[str, str]) -> Page:
    c = _Canvas(family)
    org, sender, recipient = _company(rng), _name(rng), _name(rng)
    title = rng.choice(("Director of Research", "Vice President", "Program Manager", "Treasurer"))
    dated, meeting = _date(rng), _date(rng)
    city = rng.choice(CITIES)[0]
    grant, attendees = _dollars(rng.randint(5, 250) * 500), rng.randint(12, 90)
    c.text(850, 150, org.upper(), 54, bold=True, anchor="ma")
    c.text(850, 225, f"{_street(rng)}  |  {_city(rng)}", 30, anchor="ma")
    c.rule(280, width=4)
    c.text(150, 360, dated, 34)
    for k, line in enumerate((f"Dr. {recipient}", _company(rng), _street(rng), _city(rng))):
        c.text(150, 460 + 48 * k, line, 34)
    c.text(150, 700, f"Dear Dr. {recipient.split()[-1]}:", 34)
    body = (
        f"Thank you for agreeing to take part in our review meeting, which will be held in {city} "
        f"on {meeting}. We expect about {attendees} participants from member laboratories. "
        f"I am pleased to confirm that the committee has approved a grant of {grant[0]} to "
        "support the preparation of your report. Please send the final budget to my office "
        "at least two weeks before the meeting."
    )
    y = c.paragraph(150, 790, body, 34, 1400) + 40
    y = c.paragraph(150, y, "If you have any questions, do not hesitate to contact me.", 34, 1400)
    c.text(150, y + 60, "Sincerely,", 34)
    c.text(150, y + 200, sender, 34)
    c.text(150, y + 248, title, 34)
    copy = _name(rng)
    c.text(150, y + 340, f"cc: {copy}", 22)
    return Page(
        "letter",
        c.image,
        [
            Question("To whom is the letter addressed?", [f"Dr. {recipient}", recipient]),
            Question("What is the date of the letter?", [dated]),
            Question("Who signed the letter?", [sender]),
            Question("What is the title of the sender?", [title]),
            Question("Where will the review meeting be held?", [city]),
            Question("When will the review meeting be held?", [meeting]),
            Question("What is the amount of the grant?", grant[1]),
            Question("How many participants are expected?", [str(attendees)]),
            Question(
                "What is the name of the organization in the letterhead?",
                [org.upper(), org],
            ),
            Question("Who received a copy of the letter?", [copy]),
        ],
    )


def _table(rng: random.Random, family: tuple[str, str]) -> Page:
    c = _Canvas(family)
    first = rng.randint(1975, 1995)
    years = [first, first + 1, first + 2]
    rows = rng.sample(EXPENSE_ROWS, rng.randint(6, 9))
    org = _company(rng)
    c.text(850, 180, org, 50, bold=True, anchor="ma")
    c.text(850, 260, "STATEMENT OF EXPENSES", 40, bold=True, anchor="ma")
    c.text(
        850,
        320,
        f"For the Years Ended December 31, {years[0]}, {years[1]} and {years[2]}",
        30,
        anchor="ma",
    )
    cols = (1000, 1275, 1550)
    y = 450
    for x, year in zip(cols, years):
        c.text(x, y, str(year), 36, bold=True, anchor="ra")
    c.rule(y + 60)
    values = {row: [rng.randint(800, 240000) for _ in years] for row in rows}
    for k, row in enumerate(rows):
        c.text(150, y + 90 + 62 * k, row, 34)
        for x, v in zip(cols, values[row]):
            c.text(x, y + 90 + 62 * k, _dollars(v)[0], 34, anchor="ra")
    totals = [sum(values[row][j] for row in rows) for j in range(3)]
    y = y + 90 + 62 * len(rows) + 20
    c.rule(y - 10, x0=700)
    c.text(150, y + 10, "Total Expenses", 34, bold=True)
    for x, v in zip(cols, totals):
        c.text(x, y + 10, _dollars(v)[0], 34, bold=True, anchor="ra")
    preparer = _name(rng)
    c.text(150, y + 120, f"Prepared by {preparer}, Office of the Controller", 22)
    questions = [
        Question(
            f"What is the Expenses for {row} for {years[j]}?",
            _dollars(values[row][j])[1],
        )
        for row in rng.sample(rows, 5)
        for j in (rng.randrange(3),)
    ]
    j = rng.randrange(3)
    questions += [
        Question(f"What are the total expenses for {years[j]}?", _dollars(totals[j])[1]),
        Question("What is the name of the organization?", [org]),
        Question("What is the title of the statement?", ["STATEMENT OF EXPENSES"]),
        Question("Who prepared the statement?", [preparer]),
    ]
    return Page("table", c.image, questions)


LAYOUTS: dict[str, Callable[[random.Random, tuple[str, str]], Page]] = {
    "invoice": _invoice,
    "receipt": _receipt,
    "form": _form,
    "letter": _letter,
    "table": _table,
}


# ---------------------------------------------------------------- scan artefacts and OCR


SCAN_QUALITIES = {  # name: (weight, max |rotation| deg, blur range, noise sd range, JPEG q range, scale, fade)
    "clean": (4, 0.5, (0.3, 0.7), (3.0, 6.0), (70, 90), 1.0, 1.0),
    "worn": (3, 1.0, (0.7, 1.1), (6.0, 12.0), (40, 60), 0.6, 0.85),
    "poor": (2, 1.5, (1.1, 1.6), (12.0, 20.0), (20, 35), 0.34, 0.52),
}


def _scan(image: Image.Image, quality: str, rng: random.Random, noise: np.random.Generator) -> Image.Image:
    """Rotation, low-resolution resampling, blur, faded ink, sensor noise and a JPEG round trip."""
    _, tilt, blur, sd, jpeg, scale, fade = SCAN_QUALITIES[quality]
    image = image.rotate(rng.uniform(-tilt, tilt), resample=Image.Resampling.BICUBIC, fillcolor=255)
    if scale < 1.0:
        small = (round(PAGE_SIZE[0] * scale), round(PAGE_SIZE[1] * scale))
        image = image.resize(small, Image.Resampling.BILINEAR).resize(PAGE_SIZE, Image.Resampling.BICUBIC)
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(*blur)))
    pixels = 255.0 - (255.0 - np.asarray(image, dtype=np.float32)) * fade
    pixels += noise.standard_normal(pixels.shape, dtype=np.float32) * rng.uniform(*sd)
    specks = noise.integers(0, pixels.size, pixels.size // 2500)  # dust
    pixels.flat[specks] = 0.0
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=rng.randint(*jpeg))
    buffer.seek(0)
    return Image.open(buffer).convert("L")


def ocr_text(image_path: Path) -> str:
    """Plain tesseract text of a page, single-threaded so a pool of workers stays predictable."""
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    done = subprocess.run(
        ["tesseract", str(image_path), "stdout"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tesseract failed on {image_path}: {done.stderr.strip()[-300:]}")
    return done.stdout


def best_ocr_anls(ocr: str, answers: list[str]) -> float:
    """Best ANLS of any window of consecutive OCR tokens on one line against the answers."""
    golds = [g for g in (normalize(a) for a in answers) if g]
    best = 0.0
    for line in ocr.splitlines():
        tokens = normalize(line).split()
        for gold in golds:
            width = len(gold.split())
            for size in range(max(1, width - 2), width + 3):
                for start in range(len(tokens) - size + 1):
                    best = max(best, anls(" ".join(tokens[start : start + size]), [gold]))
                    if best == 1.0:
                        return best
    return best


def difficulty_label(score: float) -> str:
    return "easy" if score >= 1.0 else "medium" if score >= 0.8 else "hard"


# ---------------------------------------------------------------- generation pipeline


def _page_job(seed: int, index: int, out_dir: str) -> tuple[list[dict[str, Any]], int]:
    """Draw, degrade, save and OCR page ``index``; return (kept task rows, dropped count)."""
    rng = random.Random(f"synth_docs:{seed}:{index}")
    kind = list(LAYOUTS)[index % len(LAYOUTS)]
    page = LAYOUTS[kind](rng, rng.choice(FONT_FAMILIES))
    names = list(SCAN_QUALITIES)
    quality = rng.choices(names, weights=[SCAN_QUALITIES[q][0] for q in names])[0]
    image = _scan(page.image, quality, rng, np.random.default_rng([seed, index]))
    name = f"synth_{seed}_{index:04d}.png"
    path = Path(out_dir) / name
    image.save(path, format="PNG", dpi=(DPI, DPI), compress_level=3)
    text = ocr_text(path)
    candidates = rng.sample(page.questions, min(QUESTIONS_PER_PAGE, len(page.questions)))
    kept = []
    for k, q in enumerate(candidates):
        score = best_ocr_anls(text, q.answers)
        if score < MIN_OCR_ANLS:
            continue
        kept.append(
            {
                "id": f"docvqa_synth_{seed}_{index:04d}_{k}",
                "question": q.text,
                "answers": q.answers,
                "image": name,
                "source": SOURCE,
                "doc_type": kind,
                "page": index,
                "scan_quality": quality,
                "ocr_anls": round(score, 4),
                "difficulty": difficulty_label(score),
            }
        )
    return kept, len(candidates) - len(kept)


def generate_docvqa_tasks(n_questions: int, seed: int = 0, out_dir: str | Path = ".") -> list[DocTask]:
    """Generate ``n_questions`` OCR-checked questions; write pages, tasks.jsonl, manifest.json.

    Pages are processed in order by ``WORKERS`` worker processes and the first
    ``n_questions`` kept questions are returned, so the result depends only on the seed.  The
    workers are fresh interpreters of :class:`agent_envs.core.workers.FreshPool`, not a
    ``multiprocessing`` pool: this runs on a user's first ``env.reset()``, from scripts without a
    ``__main__`` guard, ``python -`` and notebooks, whose main a spawned child would run again (or
    fail to find).  Process workers rather than threads: drawing and scoring hold the GIL, and
    threads were about a third slower on two cores.
    """
    if n_questions < 1 or seed < 0:
        raise ValueError(f"need n_questions >= 1 and seed >= 0, got {n_questions}, {seed}")
    if shutil.which("tesseract") is None:
        raise RuntimeError("the synthetic DocVQA set needs the tesseract CLI (apt: tesseract-ocr)")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    started, dropped, pages = time.perf_counter(), 0, 0
    with FreshPool(_page_job, WORKERS) as pool:
        while len(rows) < n_questions:
            if pages > 50 + n_questions:  # every page keeps some questions in practice
                raise RuntimeError("synthetic page generation keeps too few questions")
            batch = max(WORKERS, -(-(n_questions - len(rows)) // (QUESTIONS_PER_PAGE - 1)))
            jobs = [(seed, i, str(out)) for i in range(pages, pages + batch)]
            for kept, lost in pool.map(jobs):
                rows.extend(kept)
                dropped += lost
            pages += batch
    rows = rows[:n_questions]
    used = {row["image"] for row in rows}
    for i in range(pages):  # pages whose questions all fell beyond n_questions
        if f"synth_{seed}_{i:04d}.png" not in used:
            (out / f"synth_{seed}_{i:04d}.png").unlink()
    with (out / "tasks.jsonl").open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rows)
    manifest = {
        "version": VERSION,
        "seed": seed,
        "n_questions": n_questions,
        "pages": pages,
        "pages_used": len(used),
        "kept": len(rows),
        "dropped": dropped,
        "seconds": round(time.perf_counter() - started, 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return [DocTask.model_validate({**row, "image": str(out / row["image"])}) for row in rows]


def builtin_cache_dir(n_questions: int, seed: int, cache_root: Path) -> Path:
    """Folder named by a hash of the generator version and parameters."""
    key = json.dumps({"version": VERSION, "n": n_questions, "seed": seed, "size": PAGE_SIZE})
    return cache_root / "synthetic_docs" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _pages_missing(folder: Path) -> bool:
    with (folder / "tasks.jsonl").open(encoding="utf-8") as fh:
        return not all((folder / json.loads(line)["image"]).is_file() for line in fh if line.strip())


def builtin_tasks_file(n_questions: int, seed: int, cache_root: Path) -> Path:
    """Path of the cached set's tasks.jsonl, generating the set first if it is not finished.

    Generated once however many processes ask at the same time, and never seen half-written
    (:func:`agent_envs.core.cache.build_once`).  A finished set whose pages were deleted by hand loses
    its marker and is generated again.  The builder says so on stderr, since the first reset of
    DocVQA-CLI-v0 otherwise looks stuck for the half minute the default set takes on two cores.
    """
    target = builtin_cache_dir(n_questions, seed, cache_root)
    if is_complete(target) and _pages_missing(target):
        (target / MARKER).unlink(missing_ok=True)

    def build(out: Path) -> None:
        print(
            f"[agent-envs] generating {n_questions} synthetic DocVQA questions into {target} (once)",
            file=sys.stderr,
            flush=True,
        )
        generate_docvqa_tasks(n_questions, seed, out)

    build_once(target, build)
    return target / "tasks.jsonl"
