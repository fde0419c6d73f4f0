"""The configuration: the typed settings (`settings.Config`), the project's file read into them (`file.load_config`),
and TaskWeaver's own JSON config read as ours (`taskweaver_json`). Imports nothing above the errors and the records."""
