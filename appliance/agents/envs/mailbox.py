"""A synthetic mailbox for the email-search environment, generated from a seed (no data files shipped).

Every email comes from a template with slots (a meeting room, a tracking
number, a door code, a due date); each template's key slot (the meeting's
topic, the item, the lab, the project) is unique within the mailbox, so every
question has exactly one right email, while the other emails of the same kind
are near-miss distractors for a keyword search. Newsletters add noise.

Run as a script to look at one: `python -m appliance.agents.envs.mailbox --seed 0 --size 60`
(one JSON email per line on stdout, then the questions with `--questions`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass

FIRST = ["Dana", "Ravi", "Mei", "Tomas", "Aisha", "Lukas", "Sofia", "Kenji", "Nora", "Omar", "Ines", "Pavel"]
LAST = ["Kim", "Patel", "Chen", "Novak", "Bello", "Weber", "Rossi", "Sato", "Berg", "Haddad", "Silva", "Ivanov"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["March", "April", "May", "June", "September", "October"]
TOPICS = [
    "budget review",
    "hiring plan",
    "safety audit",
    "GPU allocation",
    "grant renewal",
    "lab move",
    "data retention",
    "conference travel",
    "seminar series",
    "cluster upgrade",
]
ITEMS = [
    "pipette set",
    "centrifuge rotor",
    "label printer",
    "fume hood filter",
    "microscope lamp",
    "freezer rack",
    "network switch",
    "UPS battery",
    "reagent kit",
    "glove box seal",
]
LABS = ["cryo lab", "clean room", "server room", "wet lab", "imaging suite", "machine shop", "cold store"]
PROJECTS = ["Atlas", "Beacon", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Harbor", "Iris", "Juniper"]
NEWS = ["cafeteria menu", "parking works", "IT newsletter", "fire drill", "holiday schedule", "recycling"]


@dataclass(frozen=True)
class Email:
    id: str
    sender: str
    to: str
    date: str
    subject: str
    body: str

    def header(self) -> str:
        return f"{self.id} | {self.date} | from {self.sender} | {self.subject}"

    def full(self) -> str:
        return f"id: {self.id}\nfrom: {self.sender}\nto: {self.to}\ndate: {self.date}\nsubject: {self.subject}\n\n{self.body}"


@dataclass(frozen=True)
class Question:
    email_id: str
    question: str
    answer: str


def _person(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return f"{first} {last}", f"{first.lower()}.{last.lower()}@lab.example"


def _meeting(rng, key, sender, to):
    room, day, hour = (
        f"{rng.choice('ABCDE')}{rng.randint(1, 4)}{rng.randint(10, 39)}",
        rng.choice(DAYS),
        rng.randint(9, 16),
    )
    return (
        f"{key.capitalize()} meeting",
        f"Hi {to},\nthe {key} meeting is on {day} at {hour}:00 in room {room}. "
        f"Please bring your notes.\nBest, {sender}",
        f"In which room is the {key} meeting?",
        room,
    )


def _shipment(rng, key, sender, to):
    tracking = f"TRK{rng.randint(100000, 999999)}"
    return (
        f"Your {key} has shipped",
        f"Hello {to},\nthe {key} you ordered has shipped. Tracking number: {tracking}. "
        f"Expected in {rng.randint(2, 9)} days.\n{sender}",
        f"What is the tracking number of the {key} order?",
        tracking,
    )


def _door_code(rng, key, sender, to):
    code = f"{rng.randint(1000, 9999)}"
    return (
        f"New door code for the {key}",
        f"Hi {to},\nfrom today the door code of the {key} is {code}. Do not share it.\n{sender}",
        f"What is the door code of the {key}?",
        code,
    )


def _deadline(rng, key, sender, to):
    due = f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"
    return (
        f"Project {key} report",
        f"Dear {to},\nreminder: the {key} project report is due on {due}. Send drafts to me.\nThanks, {sender}",
        f"When is the {key} project report due?",
        due,
    )


TEMPLATES = [(_meeting, TOPICS), (_shipment, ITEMS), (_door_code, LABS), (_deadline, PROJECTS)]


def generate_mailbox(seed: int = 0, size: int = 60) -> tuple[list[Email], list[Question]]:
    """`size` emails (about one in six a newsletter) and one question per non-newsletter email."""
    rng = random.Random(seed)
    unused = {template: rng.sample(keys, len(keys)) for template, keys in TEMPLATES}
    emails, questions = [], []
    for number in range(size):
        (sender, sender_address), (to, _) = _person(rng), _person(rng)
        email_id = f"m{number:04d}"
        date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        choices = [template for template, keys in unused.items() if keys]
        if not choices or rng.random() < 1 / 6:
            topic = rng.choice(NEWS)
            subject, body = (
                f"{topic.capitalize()} update",
                f"All,\nthe {topic} update for this week is attached.\n{sender}",
            )
        else:
            template = rng.choice(choices)
            subject, body, question, answer = template(rng, unused[template].pop(), sender, to.split()[0])
            questions.append(Question(email_id, question, answer))
        emails.append(Email(email_id, sender_address, to.split()[0].lower() + "@lab.example", date, subject, body))
    return emails, questions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=60)
    parser.add_argument("--questions", action="store_true", help="print the questions instead of the emails")
    args = parser.parse_args(argv)
    emails, questions = generate_mailbox(args.seed, args.size)
    for row in questions if args.questions else emails:
        sys.stdout.write(json.dumps(asdict(row)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
