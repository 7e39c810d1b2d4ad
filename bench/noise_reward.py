"""A reward that varies within every group (a hash of the completion), so that every step really trains."""

import hashlib


def noise(prompt, completion, reference, metadata, **params):
    return int(hashlib.sha256(completion.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
