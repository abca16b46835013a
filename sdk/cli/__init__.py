"""The `platform` command line: a thin layer over the SDK, one module per noun.

`main.py` builds the app; each other module holds the commands of one noun. Only typer,
rich, pyyaml and the SDK are imported at start-up; boto3 only inside `models upload`.
"""
