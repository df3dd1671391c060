"""Prompt files in, normalized prompt rows out; and the synthetic prompt set bundled with draftgen."""
