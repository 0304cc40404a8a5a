"""What partitioning tells the user: one `TacticReport` row per tactic, with its collectives'
records (`records`) and the names they carry in the program (`collective_names`), shown as
text (`text`), JSON, a Chrome trace (`chrome_trace`), HTML (`html`) or a figure (`plot`)
through the `Metadata` facade (`metadata`); `rows` makes the rows from the states a
schedule left."""
