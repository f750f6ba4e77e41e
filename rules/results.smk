# RESULTS.md: this run's tables, with the command, commit, date, versions and machine that
# made them (`snakemake --cores 1 results`, after the run and with its --configfile). The rule
# writes the run's section to results/sections/<run>.md and merges it into RESULTS.md: the
# sections of other runs already there are kept; re-measuring a run replaces its own.


rule results:
    input:
        unpack(get_results_inputs),
    output:
        output_path("results/sections/{run}.md", run=results_run_name()),
    log:
        "logs/results.log",
    conda:
        "../envs/fewerpasses.yaml"
    params:
        run=results_run_name(),
        command=results_command(),
        results_file=str(Path(workflow.basedir) / "RESULTS.md"),
    script:
        "../scripts/results_file.py"
