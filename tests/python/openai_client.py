"""Drives the burst-prefix proxy with the official OpenAI Python client, as users do.

Usage: python openai_client.py BASE_URL   (e.g. http://127.0.0.1:8080)
Prints one JSON object with what each call gave; the Rust test checks it.
"""

import json
import sys

import openai
from openai import OpenAI


def main() -> None:
    client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=30)
    out = {"openai_version": openai.__version__}

    raw = client.completions.with_raw_response.create(
        model="m", prompt="hello from the openai client", max_tokens=3
    )
    completion = raw.parse()
    out["completion"] = {
        "text": completion.choices[0].text,
        "endpoint": raw.headers.get("x-burst-prefix-endpoint"),
        "window": raw.headers.get("x-burst-prefix-window"),
    }

    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    out["chat"] = chat.choices[0].message.content

    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "stream please"}], max_tokens=4, stream=True
    )
    out["stream"] = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]

    text_stream = client.completions.create(model="m", prompt="stream text", max_tokens=3, stream=True)
    out["completion_stream"] = [c.choices[0].text for c in text_stream if c.choices]

    out["models"] = [m.id for m in client.models.list()]

    try:
        client.chat.completions.create(model="m", messages=[{"content": "no role"}])
        out["bad_request"] = None
    except openai.BadRequestError as error:
        out["bad_request"] = {"status": error.status_code, "message": error.message, "body": error.body}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
