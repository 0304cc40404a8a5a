"""Worked problems from the redistribution paper, shared by the planner and execution tests."""

# Fig. 13's P1-P4 on mesh {a:2, b:2, c:2}, in the paper's notation (axes minor to major).
FIG_13 = {
    "P1": ("[360, 184{c:2}368, 320]", "[90{c:2,a:2}360, 368, 160{b:2}320]"),
    "P2": ("[80, 40{c:2}80, 72, 64]", "[40{b:2}80, 80, 36{c:2}72, 64]"),
    "P3": ("[296, 360, 156{c:2}312]", "[74{b:2,c:2}296, 180{a:2}360, 312]"),
    "P4": ("[8{c:2}16, 16, 16, 8{a:2}16, 16, 8{b:2}16]", "[16, 16, 16, 16, 16, 8{a:2}16]"),
}
