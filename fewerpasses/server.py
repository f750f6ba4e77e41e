"""An OpenAI-compatible server that drafts: `mlx_lm.server`, with a drafter per request.

    python -m fewerpasses.server --model PATH --port N [--drafter suffix] \
        [--drafter-setting KEY=VALUE ...] [--costs DIR] [mlx_lm.server's flags]

It is mlx-lm's server (its flags, its `/v1/chat/completions` and `/v1/completions`, streamed
or not, its prompt cache), with three pieces plugged in where its classes allow:
- the request handler reads `drafter` (a name from fewerpasses.generate.DRAFTERS, or null)
  and `drafter_settings` (a mapping) from the body, defaulting to the server's `--drafter`
  and `--drafter-setting`s, and answers a bad one with HTTP 400 naming it;
- a request with a drafter is served on its own, not batched, through
  fewerpasses.generate's `stream_generate` (mlx-lm's with the drafter; greedy output is the
  same, sampled output has the same distribution);
- its prompt caches are kept apart by the cache layout the drafter's loop runs (a draft
  head's or a table's), so a request never resumes from a cache another layout wrote.
Suffix drafting's memory of earlier answers (setting `memory_tokens`, bounded in tokens) is
kept across requests with the same settings. A request may not set `head`: which head files
the server reads is the server's setting.
"""

import argparse
import dataclasses
import functools
import sys
from typing import Dict, List, Optional

import mlx_lm.server as mlx_server
from mlx_lm.server import APIHandler, GenerationArguments, ResponseGenerator

from .generate.api import load_drafter
from .generate.api import stream_generate as drafting_stream_generate
from .generate.cli import parse_settings
from .generate.drafters import DRAFTERS, settings_of

# Settings only the server's command line may give (they name files it reads).
SERVER_ONLY = ("head",)


@dataclasses.dataclass
class Defaults:
    """The server's drafter for requests that name none, and where costs come from."""

    drafter: Optional[str] = None
    settings: Dict[str, object] = dataclasses.field(default_factory=dict)
    costs: Optional[str] = None


@dataclasses.dataclass
class DraftingArguments(GenerationArguments):
    drafter: Optional[str] = None
    drafter_settings: Dict[str, object] = dataclasses.field(default_factory=dict)


def request_drafter(body: Dict, defaults: Defaults):
    """The (drafter, settings) a request body asks for; ValueError names what is wrong."""
    drafter = body.get("drafter", defaults.drafter)
    if drafter is not None and not isinstance(drafter, str):
        raise ValueError("drafter must be a string or null")
    if drafter is not None and drafter not in DRAFTERS:
        raise ValueError(f"unknown drafter {drafter!r}: choose one of {', '.join(DRAFTERS)} or null")
    given = body.get("drafter_settings", {})
    if not isinstance(given, dict):
        raise ValueError("drafter_settings must be an object")
    for key in SERVER_ONLY:
        if key in given:
            raise ValueError(f"drafter setting {key!r} is the server's (--drafter-setting {key}=...), not a request's")
    if drafter is None:
        if given:
            raise ValueError("drafter_settings were given without a drafter")
        return None, {}
    settings = {**(defaults.settings if drafter == defaults.drafter else {}), **given}
    settings_of(drafter, settings)  # raises on an unknown setting or a bad draft length
    return drafter, settings


class _KindCache:
    """The server's prompt cache, seen with every entry keyed also by a cache layout."""

    def __init__(self, lru, layout: str):
        self.lru, self.layout = lru, layout

    def fetch_nearest_cache(self, model, tokens):
        return self.lru.fetch_nearest_cache((model, self.layout), tokens)

    def insert_cache(self, model, tokens, prompt_cache, **kwargs):
        return self.lru.insert_cache((model, self.layout), tokens, prompt_cache, **kwargs)

    def __len__(self):
        return len(self.lru)

    def __getattr__(self, name):
        return getattr(self.lru, name)


class DraftingResponseGenerator(ResponseGenerator):
    """mlx-lm's generation thread; requests with a drafter go through fewerpasses' loop."""

    def __init__(self, model_provider, prompt_cache, defaults: Defaults):
        self.defaults = defaults
        super().__init__(model_provider, prompt_cache)

    def _is_batchable(self, args):
        return getattr(args, "drafter", None) is None and super()._is_batchable(args)

    def _serve_single(self, request, stream):
        _, _, args = request
        name = getattr(args, "drafter", None)
        if name is None:
            return super()._serve_single(request, stream)
        lru = self.prompt_cache
        provider = self.model_provider
        try:
            built = load_drafter(
                provider.model, name, args.drafter_settings, self.defaults.costs, provider.cli_args.model
            )
        except Exception as e:  # a head that does not fit, a cost file that is not one
            request[0].put(e)
            return None
        layout = "plain" if built.runner is provider.model else built.kind
        original = mlx_server.stream_generate
        mlx_server.stream_generate = functools.partial(
            drafting_stream_generate,
            drafter=name,
            drafter_settings=args.drafter_settings,
            costs=self.defaults.costs,
            model_path=provider.cli_args.model,
        )
        self.prompt_cache = _KindCache(lru, layout)
        try:
            return super()._serve_single(request, stream)
        finally:
            mlx_server.stream_generate = original
            self.prompt_cache = lru


class DraftingAPIHandler(APIHandler):
    """mlx-lm's handler, reading and checking the request's drafter."""

    defaults = Defaults()

    def validate_model_parameters(self) -> None:
        super().validate_model_parameters()
        self.drafter, self.drafter_settings = request_drafter(self.body, self.defaults)

    def handle_completion(self, request, stop_words: List[str]):
        generator = self.response_generator
        drafter, settings = self.drafter, self.drafter_settings

        class WithDrafter:
            def generate(self, request, args, progress_callback=None):
                args = DraftingArguments(**vars(args), drafter=drafter, drafter_settings=settings)
                return generator.generate(request, args, progress_callback=progress_callback)

            def __getattr__(self, name):
                return getattr(generator, name)

        self.response_generator = WithDrafter()
        try:
            return super().handle_completion(request, stop_words)
        finally:
            self.response_generator = generator


def handler_for(defaults: Defaults):
    return type("Handler", (DraftingAPIHandler,), {"defaults": defaults})


def make_server(host: str, port: int, model_provider, defaults: Defaults):
    """The HTTP server and its generation thread, not yet serving (`serve_forever`)."""
    from http.server import ThreadingHTTPServer

    from mlx_lm.models.cache import LRUPromptCache
    from mlx_lm.server import get_system_fingerprint

    generator = DraftingResponseGenerator(
        model_provider, LRUPromptCache(model_provider.cli_args.prompt_cache_size), defaults
    )
    handler = handler_for(defaults)
    httpd = ThreadingHTTPServer(
        (host, port),
        lambda *a, **kw: handler(generator, *a, system_fingerprint=get_system_fingerprint(), **kw),
    )
    return httpd, generator


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--drafter", choices=DRAFTERS, default=None, help="the drafter of requests that name none")
    p.add_argument("--drafter-setting", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--costs", default=None, help="a cost model file, or a pipeline run's cost directory")
    return p


def provider_of(argv: List[str]):
    """mlx_lm.server's (host, port, ModelProvider) for its command line `argv`, parsed by its
    own parser (its `main`, with `run` caught)."""
    caught = {}
    saved_run, saved_argv = mlx_server.run, sys.argv
    mlx_server.run = lambda host, port, provider, *a, **kw: caught.update(host=host, port=port, provider=provider)
    sys.argv = ["fewerpasses.server", *argv]
    try:
        mlx_server.main()
    finally:
        mlx_server.run, sys.argv = saved_run, saved_argv
    return caught["host"], caught["port"], caught["provider"]


def main(argv: Optional[List[str]] = None) -> int:
    ours, rest = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse_settings(ours.drafter_setting)
        if ours.drafter is not None:
            settings_of(ours.drafter, settings)
        elif settings:
            raise ValueError("--drafter-setting needs --drafter")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    host, port, provider = provider_of(rest)
    httpd, generator = make_server(host, port, provider, Defaults(ours.drafter, settings, ours.costs))
    print(
        f"fewerpasses.server: serving on http://{host}:{httpd.server_address[1]} (drafter {ours.drafter})", flush=True
    )
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        httpd.shutdown()
        generator.stop_and_join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
