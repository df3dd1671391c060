"""What the trainer sees: conversations, the trainers' loss-mask conventions, and masks built with the target's
own tokenizer."""
