"""A job's peer-engine rows (``engines=[llama.cpp:<type>, …]``): each row's server, started on a GGUF of the
loaded weights at its first use and stopped when the job ends, and what its rows record beside ours."""

from __future__ import annotations

from typing import Any


class PeerRows:
    """The servers of a job's peer-engine rows (``llama.cpp:ar``, ``llama.cpp:<spec type>``)."""

    def __init__(self, names: tuple[str, ...], loaded: Any, draft: str | None = None, hardware: Any = None) -> None:
        self.names, self.loaded, self.draft, self.hardware = names, loaded, draft, hardware
        self.servers: dict[str, Any] = {}
        self.columns = {n: {"budget": "fixed", "cost_curve": "", "engine": n.partition(":")[0]} for n in names}
        self.params = {n: {"spec_type": "none" if n.endswith(":ar") else n.partition(":")[2]} for n in names}

    def server(self, name: str) -> Any:
        if name not in self.servers:
            from specbench.peers import llamacpp

            gguf = llamacpp.gguf_for(self.loaded.model, self.loaded.tokenizer, self.loaded.name, self.loaded.dtype)
            kind, extra = self.params[name]["spec_type"], ()
            if kind == "draft-simple":  # the draft's GGUF too, of its weights as loaded
                from specbench.models import load_draft

                draft = load_draft(self.draft, self.loaded.dtype, self.hardware)
                extra = ("-md", str(llamacpp.gguf_for(draft.model, draft.tokenizer, draft.name, draft.dtype)))
                self.columns[name]["engine_draft"] = self.draft
            server = llamacpp.LlamaServer(gguf, kind, context=self.loaded.context_length, extra=extra)
            server.start()
            self.servers[name] = server
            self.columns[name].update(engine_version=llamacpp.VERSION, engine_command=" ".join(server.command))
        return self.servers[name]

    def generate(self, name: str, ids: list[int], max_new: int) -> Any:
        """One greedy generation by the row's engine, as a record (the server's own timings and draft counts)."""
        from specbench.peers.llamacpp import engine_record

        return engine_record(self.server(name).complete(ids, max_new), ids, max_new, name)

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
