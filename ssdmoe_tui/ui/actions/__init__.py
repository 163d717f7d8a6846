"""What the app's keys and palette commands do, one module per subject.

Each function takes the running `SsdmoeApp` (typed `Any`: importing `ui.app` here would
be a cycle) and works through its controller (`app.chat`) and its widgets; the app's
bindings and the palette call these, so the app class keeps only its own job."""
