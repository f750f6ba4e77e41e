# RESULTS.md: this run's section, with the command, commit, date, prompts, versions and machine
# that made it (`snakemake --cores 1 results`, after the run and with its --configfile). The rule
# writes the run's section to results/sections/<run>.md and merges it into RESULTS.md: the
# sections of other runs already there are kept; re-measuring a run replaces its own. The run's
# full tables go, as CSVs, to results_tables/<run>/ beside RESULTS.md (committed with it: the
# section links them), replacing that run's folder and no other.


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
        tables=str(Path(workflow.basedir) / "results_tables"),
    script:
        "../scripts/results_file.py"
