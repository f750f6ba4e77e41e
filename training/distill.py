"""A distillation corpus: a chat model's own greedy answers to prompts made offline.

The prompts are templates x topic lists written here, plus arithmetic with numbers drawn
from a seeded generator, so any machine rebuilds the same list. The teacher answers them
through its chat template, greedily, in batches (mlx-lm's BatchGenerator), and each answer
token is stored with the teacher's top-k log-probabilities at that position.
Held-out evaluation prompts (config/prompts/chat_mixed.yaml, config/questions/general_21.yaml)
are never used, and prompts that contain one of them are refused.
"""

import json
import random
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np

CONCEPTS = [
    "photosynthesis",
    "inflation",
    "machine learning",
    "the water cycle",
    "black holes",
    "supply and demand",
    "DNA replication",
    "compound interest",
    "plate tectonics",
    "vaccines",
    "climate change",
    "the immune system",
    "recursion",
    "public-key encryption",
    "blockchains",
    "gravity",
    "evolution by natural selection",
    "the stock market",
    "opportunity cost",
    "entropy",
    "electric circuits",
    "magnetism",
    "volcanoes",
    "earthquakes",
    "the greenhouse effect",
    "the Industrial Revolution",
    "the Roman Empire",
    "democracy",
    "the printing press",
    "the theory of relativity",
    "quantum computing",
    "neural networks",
    "operating systems",
    "compilers",
    "virtual memory",
    "version control with Git",
    "cloud computing",
    "the internet",
    "DNS",
    "HTTP cookies",
    "object-oriented programming",
    "functional programming",
    "unit testing",
    "big O notation",
    "sorting algorithms",
    "binary numbers",
    "prime numbers",
    "probability",
    "the Pythagorean theorem",
    "statistics",
    "calculus",
    "the placebo effect",
    "cognitive biases",
    "sleep cycles",
    "nutrition",
    "the circulatory system",
    "antibiotic resistance",
    "renewable energy",
    "solar panels",
    "nuclear fission",
    "batteries",
    "tides",
    "the seasons",
    "the phases of the Moon",
    "rainbows",
    "the solar system",
    "stars and galaxies",
    "ecosystems",
    "biodiversity",
    "the carbon cycle",
    "ocean currents",
    "weather forecasting",
    "hurricanes",
    "erosion",
    "the scientific method",
    "critical thinking",
    "philosophy of mind",
    "ethics",
    "game theory",
    "taxes",
    "interest rates",
    "central banks",
    "globalization",
    "cryptocurrency",
    "insurance",
    "credit scores",
    "marketing",
    "leadership",
    "project management",
    "time management",
    "remote work",
    "mindfulness",
    "the history of jazz",
    "impressionist painting",
    "the Renaissance",
    "ancient Egypt",
    "the Silk Road",
    "the Cold War",
    "the Moon landing",
    "the human brain",
    "memory",
    "language learning",
    "music theory",
    "photography",
    "architecture",
    "urban planning",
    "public transport",
    "electric cars",
    "3D printing",
    "robotics",
    "artificial intelligence",
    "data privacy",
    "open source software",
    "spreadsheets",
    "databases",
    "APIs",
    "web browsers",
    "computer viruses",
    "passwords",
    "the CPU cache",
    "GPUs",
    "parallel computing",
    "caching",
    "load balancing",
    "microservices",
    "containers",
    "regular expressions",
]

CONCEPT_TEMPLATES = [
    "Explain {t} in simple terms.",
    "What is {t}?",
    "Give a short overview of {t}.",
    "Explain {t} to a high school student.",
    "What are the main ideas behind {t}?",
    "Write a short paragraph about {t}.",
    "Why is {t} important?",
    "What are common misconceptions about {t}?",
    "Summarize {t} in three sentences.",
    "List three key facts about {t}.",
    "How would you teach {t} to a beginner?",
    "Write a quiz question about {t} and give the answer.",
    "What are the advantages and disadvantages of {t}?",
    "Describe the history of {t} briefly.",
]

CODE_TASKS = [
    "checks whether a string is a palindrome",
    "computes the factorial of a number",
    "merges two sorted lists",
    "counts word frequencies in a text",
    "finds the largest element in a list",
    "removes duplicates from a list while keeping the order",
    "converts Celsius to Fahrenheit",
    "checks whether a number is prime",
    "returns the first n Fibonacci numbers",
    "sums the even numbers in a list",
    "flattens a nested list",
    "checks whether two strings are anagrams",
    "performs a binary search",
    "sorts a list of records by a key",
    "counts the vowels in a string",
    "computes the greatest common divisor",
    "reverses the words in a sentence",
    "finds the second largest number in a list",
    "transposes a matrix",
    "computes the average of a list of numbers",
    "checks whether brackets in a string are balanced",
    "converts a decimal number to binary",
    "capitalizes the first letter of every word",
    "finds the most common element in a list",
    "rotates a list by k positions",
    "computes the power set of a set",
    "implements a stack",
    "implements a queue with two stacks",
    "reads a text file and counts its lines",
    "generates a random password",
    "validates a date string in YYYY-MM-DD format",
    "computes a running total",
    "finds all pairs in a list that sum to a target",
    "checks whether a year is a leap year",
    "computes the dot product of two vectors",
    "splits a list into chunks of size n",
    "finds the longest word in a sentence",
    "removes whitespace from both ends of a string",
    "computes the median of a list",
    "converts a string to title case",
    "implements bubble sort",
    "implements insertion sort",
    "counts the digits of an integer",
    "checks whether a list is sorted",
    "merges two dictionaries",
    "computes the nth triangular number",
]

LANGUAGES = ["Python", "JavaScript", "C", "Java", "Rust", "Go", "C++", "TypeScript"]

CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Show me {lang} code that {task}.",
    "In {lang}, how do I write a function that {task}?",
    "Write a short {lang} program that {task}, and explain how it works.",
]

ACTIVITIES = [
    "learn a new language",
    "start running",
    "save money",
    "plant a vegetable garden",
    "prepare for a job interview",
    "improve my sleep",
    "change a flat tire",
    "make a monthly budget",
    "write a resume",
    "brew good coffee",
    "organize a small kitchen",
    "train a puppy",
    "study for an exam",
    "give a good presentation",
    "reduce stress",
    "learn to play the guitar",
    "start a small business",
    "negotiate a salary",
    "cook rice on the stove",
    "keep houseplants alive",
    "write a cover letter",
    "make new friends in a new city",
    "stay focused while working from home",
    "clean a laptop keyboard",
    "back up my computer",
    "learn to code",
    "read more books",
    "plan a road trip",
    "pack for a week-long trip",
    "paint a room",
    "fix a leaking tap",
    "learn to swim as an adult",
    "run a productive meeting",
    "take better photos with a phone",
    "start meditating",
    "eat more vegetables",
    "prepare for a marathon",
    "write a short story",
    "set up a home network",
    "learn to draw",
    "improve my handwriting",
    "make bread at home",
    "build a habit",
    "stop procrastinating",
    "choose a laptop",
    "write clear emails",
]

ACTIVITY_TEMPLATES = [
    "How do I {a}?",
    "Give me five tips to {a}.",
    "What is the best way to {a}?",
    "Write a step-by-step guide to {a}.",
    "What mistakes should beginners avoid when they {a}?",
]

SUBJECTS = [
    "a rainy afternoon",
    "a cat who loves music",
    "the ocean at night",
    "an old bicycle",
    "a busy train station",
    "friendship",
    "autumn leaves",
    "a robot learning to paint",
    "a mountain village",
    "the city at dawn",
    "a forgotten library",
    "a dragon who is afraid of fire",
    "the last day of summer",
    "a garden in spring",
    "a journey across the desert",
    "a small bakery",
    "a child's first day at school",
    "the stars",
    "an astronaut far from home",
    "a river",
    "a thunderstorm",
    "a lost dog finding its way home",
    "a chess game",
    "coffee in the morning",
    "a secret door in an old house",
    "the wind",
    "a market in the morning",
]

WRITING_TEMPLATES = [
    "Write a short poem about {s}.",
    "Write a limerick about {s}.",
    "Write a very short story about {s}.",
    "Write an opening line for a novel about {s}.",
    "Describe {s} in vivid detail.",
]

EMAIL_TASKS = [
    "asking your manager for a day off",
    "thanking a friend for a birthday gift",
    "inviting colleagues to a team lunch",
    "apologizing to a customer for a late delivery",
    "asking a professor for a letter of recommendation",
    "reminding a client about an unpaid invoice",
    "declining a meeting invitation politely",
    "welcoming a new employee to the team",
    "requesting a refund for a broken product",
    "following up after a job interview",
    "announcing a change in office hours",
    "asking a neighbour to keep the noise down",
]

COUNTRIES = [
    "Canada",
    "Brazil",
    "Germany",
    "Italy",
    "Spain",
    "Egypt",
    "Kenya",
    "India",
    "China",
    "Mexico",
    "Argentina",
    "Norway",
    "Sweden",
    "Poland",
    "Greece",
    "Turkey",
    "Vietnam",
    "Thailand",
    "Peru",
    "Chile",
    "Nigeria",
    "Portugal",
    "Ireland",
    "New Zealand",
    "South Korea",
    "Indonesia",
    "Morocco",
    "Finland",
    "Austria",
    "Hungary",
]

COUNTRY_TEMPLATES = [
    "What is the capital of {c}?",
    "Tell me three interesting facts about {c}.",
    "What languages are spoken in {c}?",
    "What is {c} famous for?",
    "Describe the geography of {c} briefly.",
]

PEOPLE = [
    "Marie Curie",
    "Isaac Newton",
    "Albert Einstein",
    "Ada Lovelace",
    "Alan Turing",
    "Leonardo da Vinci",
    "Charles Darwin",
    "Nelson Mandela",
    "Cleopatra",
    "Galileo Galilei",
    "Mahatma Gandhi",
    "Frida Kahlo",
    "Ludwig van Beethoven",
    "Wolfgang Amadeus Mozart",
    "Nikola Tesla",
    "Rosalind Franklin",
    "Aristotle",
    "Confucius",
    "Julius Caesar",
    "Napoleon Bonaparte",
    "Jane Austen",
    "Leo Tolstoy",
    "Grace Hopper",
    "Abraham Lincoln",
    "Florence Nightingale",
    "Vincent van Gogh",
    "Johannes Gutenberg",
    "Thomas Edison",
]

PEOPLE_TEMPLATES = ["Who was {p}?", "What is {p} best known for?", "Write a short biography of {p}."]

ANIMALS = [
    "elephants",
    "octopuses",
    "penguins",
    "honeybees",
    "wolves",
    "dolphins",
    "owls",
    "tigers",
    "koalas",
    "ants",
    "sharks",
    "parrots",
    "camels",
    "frogs",
    "bats",
    "whales",
    "foxes",
    "turtles",
    "giraffes",
    "crows",
]

ANIMAL_TEMPLATES = [
    "Tell me about {x}.",
    "What do {x} eat?",
    "Where do {x} live?",
    "Give three surprising facts about {x}.",
]

FOODS = [
    "lentils",
    "oatmeal",
    "spinach",
    "salmon",
    "eggs",
    "brown rice",
    "avocados",
    "blueberries",
    "chickpeas",
    "yogurt",
    "broccoli",
    "sweet potatoes",
    "almonds",
    "quinoa",
    "mushrooms",
    "pasta",
    "tofu",
    "bananas",
]

FOOD_TEMPLATES = ["What are the health benefits of {f}?", "How do you cook {f}?", "Suggest a simple recipe with {f}."]

JOBS = [
    "a data scientist",
    "an electrician",
    "a nurse",
    "an architect",
    "a pilot",
    "a librarian",
    "a software engineer",
    "an accountant",
    "a pharmacist",
    "a firefighter",
    "a translator",
    "a chef",
    "a veterinarian",
    "a journalist",
    "a civil engineer",
    "a teacher",
    "a product manager",
    "a lawyer",
    "a plumber",
    "a marine biologist",
]

JOB_TEMPLATES = ["What does {j} do?", "What skills do you need to become {j}?", "Describe a typical day for {j}."]

PAIRS = [
    ("cats", "dogs"),
    ("renting", "buying a home"),
    ("Python", "JavaScript"),
    ("tea", "coffee"),
    ("trains", "planes for travel"),
    ("e-books", "paper books"),
    ("running", "cycling"),
    ("SQL", "NoSQL databases"),
    ("stocks", "bonds"),
    ("laptops", "desktop computers"),
    ("summer", "winter"),
    ("mitosis", "meiosis"),
    ("weather", "climate"),
    ("viruses", "bacteria"),
    ("RAM", "storage"),
    ("socialism", "capitalism"),
    ("classical music", "jazz"),
    ("Linux", "Windows"),
    ("democracy", "monarchy"),
    ("speed", "velocity"),
    ("a compiler", "an interpreter"),
    ("arrays", "dictionaries"),
    ("weight", "mass"),
    ("fruits", "vegetables"),
]

PAIR_TEMPLATES = [
    "Compare {x} and {y}.",
    "What is the difference between {x} and {y}?",
    "Which is better, {x} or {y}? Explain.",
]

SENTENCES = [
    "me and him goes to the store yesterday",
    "The meeting has been moved to next Tuesday.",
    "I can't believe how fast this year went by.",
    "Please send me the report before noon.",
    "their going to announce the results tomorow",
    "The weather is nice today, so we are going to the park.",
    "We need to talk about the budget for next quarter.",
    "The cat sat on the warm windowsill all afternoon.",
    "Learning to cook has changed the way I eat.",
    "this product is the best i ever buyed",
    "The train was late because of the snow.",
    "Thank you for your help with the move.",
    "Our team finished the project two weeks early.",
    "He don't like when people is late.",
    "The museum opens at nine and closes at five.",
    "I would like to book a table for four people.",
]

SENTENCE_TEMPLATES = [
    'Rewrite this sentence to sound more formal: "{s}"',
    'Correct the grammar of this sentence: "{s}"',
    'Translate into French: "{s}"',
    'Translate into Spanish: "{s}"',
    'Paraphrase this sentence in two different ways: "{s}"',
]

# Category -> share of the prompts.
WEIGHTS = {
    "concept": 0.30,
    "code": 0.15,
    "howto": 0.11,
    "writing": 0.08,
    "email": 0.03,
    "country": 0.04,
    "people": 0.03,
    "animal": 0.03,
    "food": 0.02,
    "job": 0.02,
    "compare": 0.04,
    "math": 0.08,
    "sentence": 0.07,
}


def _pool(category: str) -> List[str]:
    if category == "concept":
        return [t.format(t=c) for c in CONCEPTS for t in CONCEPT_TEMPLATES]
    if category == "code":
        return [t.format(lang=l, task=k) for k in CODE_TASKS for l in LANGUAGES for t in CODE_TEMPLATES]
    if category == "howto":
        return [t.format(a=a) for a in ACTIVITIES for t in ACTIVITY_TEMPLATES]
    if category == "writing":
        return [t.format(s=s) for s in SUBJECTS for t in WRITING_TEMPLATES]
    if category == "email":
        return [f"Write a short email {e}." for e in EMAIL_TASKS] + [
            f"Draft a polite message {e}." for e in EMAIL_TASKS
        ]
    if category == "country":
        return [t.format(c=c) for c in COUNTRIES for t in COUNTRY_TEMPLATES]
    if category == "people":
        return [t.format(p=p) for p in PEOPLE for t in PEOPLE_TEMPLATES]
    if category == "animal":
        return [t.format(x=x) for x in ANIMALS for t in ANIMAL_TEMPLATES]
    if category == "food":
        return [t.format(f=f) for f in FOODS for t in FOOD_TEMPLATES]
    if category == "job":
        return [t.format(j=j) for j in JOBS for t in JOB_TEMPLATES]
    if category == "compare":
        return [t.format(x=x, y=y) for x, y in PAIRS for t in PAIR_TEMPLATES]
    if category == "sentence":
        return [t.format(s=s) for s in SENTENCES for t in SENTENCE_TEMPLATES]
    raise KeyError(category)


def _math_prompt(rng: random.Random) -> str:
    a, b = rng.randint(11, 999), rng.randint(2, 99)
    kind = rng.randrange(8)
    if kind == 0:
        return f"What is {a} plus {b}?"
    if kind == 1:
        return f"What is {a} times {b}? Show your working."
    if kind == 2:
        return f"What is {b} percent of {a}?"
    if kind == 3:
        return f"Convert {a} kilometers to miles."
    if kind == 4:
        return f"A train travels at {b} km/h for {rng.randint(2, 9)} hours. How far does it go?"
    if kind == 5:
        return f"I have {a} apples and give away {min(b, a - 1)}. How many are left?"
    if kind == 6:
        return f"A jacket costs ${a} and is discounted by {rng.choice([10, 15, 20, 25, 30, 40, 50])}%. What is the new price?"
    return f"Is {a} a prime number? Explain."


def heldout_texts(root: Optional[Path] = None) -> List[str]:
    """The evaluation prompts this corpus must not contain (read from the project's config)."""
    import yaml

    root = Path(root or Path(__file__).resolve().parent.parent)
    out = []
    for rel, key, field in (
        ("config/prompts/chat_mixed.yaml", "prompts", "text"),
        ("config/questions/general_21.yaml", "questions", "question"),
    ):
        p = root / rel
        if p.is_file():
            out += [item[field] for item in yaml.safe_load(p.read_text())[key]]
    return out


def make_prompts(n: int, seed: int = 0, exclude: Iterable[str] = ()) -> List[Dict]:
    """n distinct prompts, each {"id", "category", "text"}, the same for the same (n, seed)."""
    rng = random.Random(seed)
    banned = [e.strip().lower() for e in exclude]
    pools = {c: _pool(c) for c in WEIGHTS if c != "math"}
    for c in pools:
        rng.shuffle(pools[c])
    counts = {c: int(round(w * n)) for c, w in WEIGHTS.items()}
    counts["concept"] += n - sum(counts.values())
    seen, chosen = set(), []
    for c, k in counts.items():
        got = 0
        source = iter(pools[c]) if c != "math" else iter(lambda: _math_prompt(rng), None)
        for text in source:
            if got == k:
                break
            low = text.lower()
            if low in seen or any(b in low or low in b for b in banned):
                continue
            seen.add(low)
            chosen.append({"category": c, "text": text})
            got += 1
    # Categories whose pool ran short: the rest from the large pools, in a seeded order.
    spare = [(c, t) for c in ("concept", "code", "howto") for t in pools[c]]
    rng.shuffle(spare)
    for c, text in spare:
        if len(chosen) >= n:
            break
        low = text.lower()
        if low in seen or any(b in low or low in b for b in banned):
            continue
        seen.add(low)
        chosen.append({"category": c, "text": text})
    rng.shuffle(chosen)
    return [dict(id=i, **p) for i, p in enumerate(chosen)]


def generate_corpus(
    teacher, prompts: List[Dict], out: Path, *, max_tokens: List[int], batch_size: int = 64, top_k: int = 8, log=print
) -> Dict:
    """The teacher's greedy answers, with its top-k log-probabilities at each answer position.

    Writes `out` (.npz): prompt and answer token ids (concatenated, with offsets) and the top-k
    ids and log-probabilities of every answer token (the end-of-turn token included).
    """
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    from selfspec.core.prompts import encode_prompt

    model, tok = load(str(teacher)) if isinstance(teacher, (str, Path)) else teacher
    eos = list(tok.eos_token_ids)
    ids = [encode_prompt(tok, p["text"], "chat") for p in prompts]
    gen = BatchGenerator(
        model, stop_tokens=[[e] for e in eos], completion_batch_size=batch_size, prefill_batch_size=min(batch_size, 16)
    )
    uids = gen.insert(ids, list(max_tokens))
    index = {u: i for i, u in enumerate(uids)}
    answers = [[] for _ in prompts]
    tk_ids = [[] for _ in prompts]
    tk_lp = [[] for _ in prompts]
    finished = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while responses := gen.next_generated():
        lp = mx.stack([r.logprobs for r in responses])
        top = mx.argpartition(-lp, kth=top_k - 1, axis=-1)[:, :top_k]
        vals = mx.take_along_axis(lp, top, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        top, vals = mx.take_along_axis(top, order, axis=-1), mx.take_along_axis(vals, order, axis=-1)
        top, vals = np.array(top), np.array(vals.astype(mx.float32))
        for j, r in enumerate(responses):
            i = index[r.uid]
            answers[i].append(int(r.token))
            tk_ids[i].append(top[j])
            tk_lp[i].append(vals[j])
            if r.finish_reason is not None:
                finished += 1
                if finished % 100 == 0:
                    n_tok = sum(len(a) for a in answers)
                    log(
                        json.dumps(
                            {
                                "prompts_done": finished,
                                "answer_tokens": n_tok,
                                "wall_s": round(time.perf_counter() - t0, 1),
                                "cpu_s": round(time.process_time() - c0, 1),
                            }
                        )
                    )
    gen.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    flat = lambda xs: np.concatenate([np.asarray(x, dtype=np.int32) for x in xs]) if xs else np.zeros(0, np.int32)
    offsets = lambda xs: np.cumsum([0] + [len(x) for x in xs]).astype(np.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        prompt_ids=flat(ids),
        prompt_offsets=offsets(ids),
        answer_ids=flat(answers),
        answer_offsets=offsets(answers),
        topk_ids=np.concatenate([np.stack(t) for t in tk_ids]).astype(np.int32),
        topk_logprobs=np.concatenate([np.stack(t) for t in tk_lp]).astype(np.float16),
    )
    stopped = sum(1 for a in answers if a and a[-1] in eos)
    info = {
        "prompts": len(prompts),
        "prompt_tokens": int(sum(len(x) for x in ids)),
        "answer_tokens": int(sum(len(a) for a in answers)),
        "answers_ended_by_eos": stopped,
        "max_tokens": sorted(set(max_tokens)),
        "top_k": top_k,
        "batch_size": batch_size,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
    }
    (out.with_suffix(".json")).write_text(json.dumps({"info": info, "prompts": prompts}, indent=1))
    return info


def load_corpus(path: Path) -> Dict:
    """The .npz as lists of (prompt ids, answer ids, top-k ids, top-k log-probs) per prompt."""
    z = np.load(path)
    po, ao = z["prompt_offsets"], z["answer_offsets"]
    items = []
    for i in range(len(po) - 1):
        a, b = ao[i], ao[i + 1]
        items.append(
            (
                z["prompt_ids"][po[i] : po[i + 1]],
                z["answer_ids"][a:b],
                z["topk_ids"][a:b],
                z["topk_logprobs"][a:b].astype(np.float32),
            )
        )
    return items


def decode_ms(model, context: int = 64, tokens: int = 32) -> float:
    """Milliseconds per greedy decode step of one sequence with a KV cache at `context`."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[5] * context]), cache=cache))
    tok = mx.array([[7]])
    for _ in range(3):
        tok = mx.argmax(model(tok, cache=cache)[:, -1:], -1)
        mx.eval(tok)
    t = time.perf_counter()
    for _ in range(tokens):
        tok = mx.argmax(model(tok, cache=cache)[:, -1:], -1)
        mx.eval(tok)
    return (time.perf_counter() - t) / tokens * 1000


def verify_ms(model, lengths=(1, 2, 3, 4, 5), context: int = 64, rounds: int = 8) -> Dict[int, float]:
    """Milliseconds of one target pass over n new tokens with a KV cache (the verify step of a
    k-token draft is n = k + 1), median over rounds, lengths interleaved."""
    import statistics

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[5] * context]), cache=cache))
    times = {n: [] for n in lengths}
    for _ in range(rounds + 1):
        for n in lengths:
            t = time.perf_counter()
            mx.eval(mx.argmax(model(mx.array([[7] * n]), cache=cache), -1))
            times[n].append(time.perf_counter() - t)
            trim_prompt_cache(cache, n)
    return {n: statistics.median(ts[1:]) * 1000 for n, ts in times.items()}


def measure(
    target_dir,
    draft_dir,
    prompt_set,
    *,
    max_tokens: int = 128,
    ks=(1, 2, 3, 4),
    repeats: int = 2,
    cost_rounds: int = 5,
    log=print,
) -> Dict:
    """The draft against its target with mlx-lm, in one process, back to back.

    Decode cost per token (round-robin, median), teacher-forced top-1 agreement on the target's
    greedy answers, and `speculative_generate_step` against `generate_step` for each draft
    length k: acceptance, tokens per target pass, speed ratio per repeat, tokens identical.
    """
    import statistics

    import mlx.core as mx
    from mlx_lm import load

    from selfspec.measure.streams import mlx_lm_selfspec_stream, plain_stream, timed_generation
    from selfspec.core.prompts import encoded_prompts, eos_ids

    target, tok = load(str(target_dir))
    draft16, _ = load(str(draft_dir))
    draft, _ = load(str(draft_dir))
    draft.set_dtype(mx.float32)
    prompts = encoded_prompts(tok, prompt_set)
    eos = eos_ids(tok)

    t_ms, d_ms, d16_ms = [], [], []
    for _ in range(cost_rounds):
        t_ms.append(decode_ms(target))
        d_ms.append(decode_ms(draft))
        d16_ms.append(decode_ms(draft16, tokens=8))
    cost = {
        "context": 64,
        "target_ms": statistics.median(t_ms),
        "draft_ms": statistics.median(d_ms),
        "draft_f16_ms": statistics.median(d16_ms),
        "rounds": cost_rounds,
    }
    cost["ratio"] = cost["draft_ms"] / cost["target_ms"]
    cost["ratio_f16"] = cost["draft_f16_ms"] / cost["target_ms"]
    cost["ratios_per_round"] = [round(d / t, 4) for d, t in zip(d_ms, t_ms)]
    v = verify_ms(target)
    cost["verify_ms"] = {str(n): round(x, 2) for n, x in v.items()}
    cost["verify_relative"] = {str(n): round(x / v[1], 3) for n, x in v.items()}
    log(json.dumps({"cost": cost}))

    def run(kind: str, k: int, p):
        x = mx.array(p["tokens"], mx.uint32)
        if kind == "plain":
            return timed_generation(lambda: plain_stream(target, x, max_tokens), len(p["tokens"]), eos)
        return timed_generation(lambda: mlx_lm_selfspec_stream(target, draft, x, max_tokens, k), len(p["tokens"]), eos)

    # Warm-up, then repeats: plain and every k back to back, the order rotated per repeat.
    run("plain", 0, prompts[0]), run("spec", 2, prompts[0])
    kinds = [("plain", 0)] + [("spec", k) for k in ks]
    results = {kk: [] for kk in kinds}
    for r in range(repeats):
        rot = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        for kk in rot:
            stats = [run(kk[0], kk[1], p) for p in prompts]
            results[kk].append(stats)
            secs = sum(s.prompt_seconds + s.decode_seconds for s in stats)
            drafted = sum(s.drafted for s in stats)
            log(
                json.dumps(
                    {
                        "repeat": r,
                        "kind": kk[0],
                        "k": kk[1],
                        "seconds": round(secs, 2),
                        "tokens": sum(len(s.tokens) for s in stats),
                        "acceptance": round(sum(s.accepted for s in stats) / drafted, 4) if drafted else None,
                    }
                )
            )

    reference = [s.tokens for s in results[("plain", 0)][0]]
    plain_secs = [sum(s.prompt_seconds + s.decode_seconds for s in rep) for rep in results[("plain", 0)]]
    spec = []
    for k in ks:
        reps = results[("spec", k)]
        secs = [sum(s.prompt_seconds + s.decode_seconds for s in rep) for rep in reps]
        drafted = sum(s.drafted for s in reps[0])
        accepted = sum(s.accepted for s in reps[0])
        passes = sum(s.full_passes for s in reps[0])
        ntok = sum(len(s.tokens) for s in reps[0])
        speedups = [p / s for p, s in zip(plain_secs, secs)]
        spec.append(
            {
                "k": k,
                "acceptance": accepted / max(1, drafted),
                "drafted": drafted,
                "accepted": accepted,
                "tokens_per_pass": ntok / max(1, passes),
                "speedups": [round(x, 3) for x in speedups],
                "speedup": statistics.median(speedups),
                "identical": all([s.tokens for s in rep] == reference for rep in reps),
                "seconds": [round(x, 2) for x in secs],
            }
        )
        log(json.dumps(spec[-1]))

    # Teacher-forced agreement on the target's greedy answers.
    agree = n = 0
    for p, ans in zip(prompts, reference):
        ids = mx.array(p["tokens"] + ans[:-1])[None]
        pred = mx.argmax(draft(ids)[0, len(p["tokens"]) - 1 :], -1).tolist()
        agree += sum(int(a == b) for a, b in zip(pred, ans))
        n += len(ans)
    agreement = {
        "prompt_set": Path(prompt_set).stem,
        "prompts": len(prompts),
        "tokens": n,
        "top1": agree / max(1, n),
        "max_tokens": max_tokens,
    }
    log(json.dumps({"agreement": agreement}))
    return {
        "setup": (
            f"Target {target_dir} (float32), draft {draft_dir} cast to float32, mlx-lm "
            f"speculative_generate_step vs generate_step, greedy, prompt set {Path(prompt_set).stem} "
            f"({len(prompts)} prompts, up to {max_tokens} tokens, end-to-end time including prefill), "
            f"{repeats} repeats back to back in one process; one thread (MKL preloaded)."
        ),
        "cost": cost,
        "agreement": agreement,
        "plain_seconds": [round(x, 2) for x in plain_secs],
        "plain_tokens": sum(len(t) for t in reference),
        "speculative": spec,
    }


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description="Measure a distilled draft against its target with mlx-lm.")
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=Path("config/prompts/chat_mixed.yaml"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ks", default="1,2,3,4")
    args = parser.parse_args(argv)
    m = measure(
        args.target,
        args.draft,
        args.prompts,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        ks=[int(k) for k in args.ks.split(",")],
        log=lambda x: print(x, flush=True),
    )
    m["command"] = "python -m training.distill " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    (args.draft / "measurements.json").write_text(json.dumps(m, indent=1) + "\n")
    if (args.draft / "training.json").is_file():
        from .distill_train import write_card

        write_card(args.draft)
    return m


if __name__ == "__main__":
    main()
