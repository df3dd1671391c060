"""draftgen serve: one SGLang server per GPU group, launched, followed through start-up and supervised."""

from draftgen.serve.config import ServeConfig, parse_gpus
from draftgen.serve.launch import LaunchSpec, router_spec, server_specs, shell_line
from draftgen.serve.supervisor import Supervisor

__all__ = [
    "LaunchSpec",
    "ServeConfig",
    "Supervisor",
    "parse_gpus",
    "router_spec",
    "server_specs",
    "shell_line",
]
